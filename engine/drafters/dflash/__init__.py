"""DFlash block drafting: one drafter forward proposes a whole block of tokens.

``method.py`` registers the method (standard library only); ``model.py`` is the drafter as a
module (training and the reference forward); ``checkpoint.py`` reads the public layouts;
``runner.py`` binds a drafter to a target for inference; ``drafter.py`` is the Drafter.
Nothing is imported here, so the registry can import ``method`` without torch.
"""
