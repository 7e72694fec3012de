"""How far the rollouts' log-probs are from the bf16 training forward, with sampling in float32 (what opct does under
--bf16) or under the same bf16 autocast (a script, not a test).

For the default organism with a random LoRA adapter, samples responses through the engine and through
`model.generate`, each with and without bf16 autocast, and prints the largest |sampler log-prob - forward log-prob|
(and the mean) over the sampled tokens against the float32 forward and against the bf16-autocast forward (the
training loss's).

    python bench/bf16_sampling.py [--seed 0] [--tokens 24] [--prompts 6]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from opct.config import positive_arg, seed_arg

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--tokens", type=positive_arg, default=24, help="response tokens per prompt")
    p.add_argument("--prompts", type=positive_arg, default=6)
    a = p.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model

    from opct.batching import pack, response_logits
    from opct.losses import log_probs, token_logprobs
    from opct.policy import load_policy

    torch.manual_seed(a.seed)
    pol = load_policy("opct/organisms/default")
    pol.model = get_peft_model(pol.model, LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                     init_lora_weights=False))
    questions = ["What is 3 plus 4?", "Is the sky green?", "Tell me about the river."]
    prompts = [pol.render([{"role": "user", "content": questions[i % 3]}]) for i in range(a.prompts)]

    def autocast(on):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=on)

    print(f"default organism + random LoRA r=8; {a.prompts} prompts x {a.tokens} tokens; seed {a.seed}")
    print(f"{'sampler':10s} {'sampled in':12s} {'|sampler - fp32 forward|: max, mean':>36s} "
          f"{'|sampler - bf16 forward|: max, mean':>36s}")
    for fast in (True, False):
        pol.fast_sampling = fast
        for bf16 in (False, True):
            torch.manual_seed(a.seed)
            with autocast(bf16):
                s = pol.sample(prompts, a.tokens, 1.0)
            batch = pack(prompts, s.response_ids, pol.pad_id, "cpu")
            worst = []
            for forward_bf16 in (False, True):
                with torch.no_grad(), autocast(forward_bf16):
                    lp = token_logprobs(log_probs(response_logits(pol.model, batch)).float(), batch.response_ids_B_R)
                d = torch.cat([(lp[i, :len(row)] - torch.tensor(row)).abs() for i, row in enumerate(s.logprobs)])
                worst.append(f"{float(d.max()):.4f}, {float(d.mean()):.4f}")
            print(f"{'engine' if fast else 'generate':10s} {'bf16' if bf16 else 'float32':12s} {worst[0]:>36s} "
                  f"{worst[1]:>36s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
