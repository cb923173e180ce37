"""The workload of the two-process test: shared by the test and its worker processes."""

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11], [12, 13, 14, 15], [16]]


def engine_requests(prompts):
    """Continuous-batching requests: mixed lengths, greedy and sampled rows, per-request seeds."""
    return [
        dict(prompt=p, max_new_tokens=4 + 3 * (i % 4), temperature=[0.0, 1.0][i % 2], seed=i)
        for i, p in enumerate(prompts)
    ]
