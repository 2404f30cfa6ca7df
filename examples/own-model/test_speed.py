"""Training-speed tests of this project's model, with gpubench's pytest fixtures.

    pytest test_speed.py --benchmark-autosave                 # the model's training step, timed
    pytest test_speed.py --gpubench-baseline-path ../main     # fails if this checkout trains slower
"""


def test_training_step(gpubench_benchmark):
    step = gpubench_benchmark(workload="mymodels:small_convnet", input_shape=(3, 32, 32), num_classes=10,
                              args={"width": 16}, batch_size=32, threads=1, steps_per_round=5, rounds=5)
    assert step.throughput > 0 and step.loss() == step.loss()  # a finite loss
    assert step.model["flops_per_sample"] > 0


def test_not_slower_than_main(gpubench_ab):
    gpubench_ab(workload="mymodels:small_convnet", input_shape=[3, 32, 32], num_classes=10, batch_size=32,
                threads=1, warmup_steps=3, steps=10, windows=3, repeats=8, budget="5m")
