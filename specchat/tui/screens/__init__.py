"""Screens of the specchat TUI."""
