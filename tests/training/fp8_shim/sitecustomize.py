"""Started with every process of a test run whose PYTHONPATH names this folder: --precision fp8
passes its hardware check as on an H100, so that a CPU process takes the trainer's fp8 path
(fp8.use_fp8 before prepare and compile, bf16 autocast around the float8 layers)."""

from distrain_cloud.training import fp8

fp8.fp8_problem = lambda gpus, capability, torchao=True: None
