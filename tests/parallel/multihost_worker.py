"""One process of the two-process test in test_sharding.py (not collected by pytest).

python tests/parallel/multihost_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_JSON
"""

import json
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_num_cpu_devices", 2)


def main():
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from helpers import SMALL_DRAFT, tiny_config
    from multihost_prompts import PROMPTS, engine_requests

    import jaxspec
    from jaxspec.models import llama

    target = llama.init(tiny_config(), seed=0, name="target")
    draft = llama.init(tiny_config(**SMALL_DRAFT), seed=2, name="small")
    local = PROMPTS[pid::nproc]  # each process reads its own share of the workload
    prompts, mine = jaxspec.multihost.share_prompts(local)
    mesh = {"data": 2, "model": jax.device_count() // 2}
    greedy = jaxspec.generate(target, prompts, draft=draft, max_new_tokens=12, temperature=0.0, mesh=mesh)
    sampled = jaxspec.generate(target, prompts, draft=draft, max_new_tokens=12, temperature=1.0, seed=7, mesh=mesh)
    engine = jaxspec.Engine(target, draft=draft, gamma=4, slots=2, mesh=mesh)
    rows = {r.index: r.tokens for r in engine.run(engine_requests(prompts))}
    with open(out, "w") as f:
        json.dump(
            {
                "devices": jax.device_count(),
                "local_devices": jax.local_device_count(),
                "prompts": prompts,
                "mine": [mine.start, mine.stop],
                "greedy": greedy.tokens,
                "sampled": sampled.tokens,
                "engine": [rows[i] for i in range(len(prompts))],
                "alpha": greedy.stats.acceptance_rate,
            },
            f,
        )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
