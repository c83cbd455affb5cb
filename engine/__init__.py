"""specchat's speculative decoding engine. No UI imports live here."""
