"""Widgets of the specchat TUI."""
