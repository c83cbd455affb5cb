"""Screens of the specchat TUI."""

NARROW = 100  # columns below which the chat's side panels stack under it and compare's panes stack
