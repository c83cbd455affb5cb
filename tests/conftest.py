"""Suite-wide settings.

Tiny random models gain nothing from a second thread, and on a shared 2-core machine two OpenMP
threads per test process stall at every barrier whenever another process holds a core (see
engine/loader.configure_threads). Tests that load the real model set their own thread count.
"""

import torch

torch.set_num_threads(1)
