"""The workload of the two-process test: shared by the test and its worker processes."""

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11], [12, 13, 14, 15], [16]]
