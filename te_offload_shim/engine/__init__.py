"""The patching engine: which attribute to wrap and how (patch), the wrapper type (wrapper), every
patch as a record that uninstall() can undo (registry), what a wrapped call does (handler), and the
typed reports of all that (status). Imported with the first patch or the first status() call, never
at start-up.
"""
