"""Jinja templates for svgen code generation (installed as the package svgen.templates)."""
