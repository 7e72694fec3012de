"""The RL-trained LM attacker: the OPCT paper's threat model — a language model that learns, by RL against each
model it attacks, to write jailbreaks for it, seeing only the model's answers and the judge's scores.

  frames.py   what it writes (an attack frame: text around a slot where the request is spliced), its prompt, and
              the synthetic wrapper compositions it is pretrained on
  lm.py       the attacker LM: a tiny Llama built from the world, pretrained on the CPU and cached by identity
  rl.py       episodes of refinement against one target, the group-baseline policy gradient, the evaluation
  run.py      `rl_attack`: training behaviours (held out from the evaluated ones), pretrain, train, evaluate

`opct.evals.attack.adaptive_attack` runs it beside the black-box wrapper search and GCG when
`AttackConfig.rl_attack` is on.
"""

from opct.evals.attacker.run import rl_attack  # noqa: F401
