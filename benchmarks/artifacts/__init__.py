"""How the artifacts the project builds or ships are made, reproducibly: the tiny random-weight
test models (`tiny_model`, built by `make setup`), the demo's sample prompts
(`sample_prompts`), the bundled execution-time models fitted on profiling data
(`exec_models`) and the length model's shipped heads (`length_head`). Their command lines are
in scripts/."""
