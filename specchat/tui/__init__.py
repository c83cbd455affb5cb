"""The Textual UI of specchat.

Importing this package imports nothing from Textual: the CLI imports ``specchat.tui.launch``
lazily, and the headless commands never pay for the UI.
"""
