"""The patching engine: which attribute to wrap and how (patch), the wrapper type (wrapper), every
patch as a record that uninstall() can undo (registry), and what a wrapped call does (handler).
Imported with the first patch, never at start-up.
"""
