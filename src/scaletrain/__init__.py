"""scaletrain: plan, launch, monitor and fix multi-GPU LLM fine-tuning.

    engine/   the typed library: catalog, memory/time model, planner, run directory, launcher, sampler, doctor
    trainer/  the bundled torch trainer and the measurements it makes (imported by `accelerate launch`)
    tui/      the terminal front ends: the CLI, the Textual wizard and monitor, plain renderings
    presets/  bundled preset YAMLs and the offline demo data
"""
