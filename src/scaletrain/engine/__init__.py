"""scaletrain's engine: the typed library behind every front end. No Textual, no Rich, no torch at import.

Each name has one address, the module that defines it (there is no second, re-exported one here). The
sub-packages, lowest layer first (a layer imports only from the layers below it; tests/test_structure.py checks):

    errors, vocabulary, units, fileio, yamlsafe   bad input as one line; the words of a plan; numbers; atomic writes
    catalog                                       model architectures and GPUs
    devices, model                                NVML; the setup and its memory and time models
    request                                       what the user asks: request, checks, presets, train options,
                                                  weights, data, and parsed arguments → all of those (args.py)
    plan                                          the planner's search, the Plan, tables, remedies, the LR rule
    run                                           the run directory: plan.json, configs, scripts, metrics, status
    launch                                        launching a run: launcher, processes, logs, lock, watchdog, status
    sampling                                      live GPU, host and run-directory samples for the monitor
    doctor                                        why a run died and what to change
"""
