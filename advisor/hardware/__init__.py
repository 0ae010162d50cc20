"""Hardware inputs: the GPU and link catalogue, the ``--gpus`` grammar and the validated cluster it
produces, training-efficiency figures, and this machine's GPUs. No torch."""
