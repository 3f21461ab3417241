"""The patching engine, knowing no framework: the target schema (schema), which attribute to wrap
and how, and what integrations may tell it about calls and classes (attributes, patch), the wrapper
type (wrapper), every patch as a record that uninstall() can undo (registry), what a wrapped call
does (handler), and the read-only reports of all that (status, with their types in states).
Imported with the first patch or the first status() call, never at start-up.
"""
