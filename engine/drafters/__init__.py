"""Drafters: one class per method, one protocol (see base.py)."""
