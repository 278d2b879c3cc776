"""Sites: the one place that turns what a user names into the plan capture acts on.

Every request that chooses ops (`layers_to_save`, `extract(layers=)`, `intervene`,
`stop_after`, patching sweeps, counterfactual replay) goes through here: `select` holds
the selectors (public as `torchlog.select`), `entries` checks what a user wrote before
anything runs, `resolve` finds the passes an entry names in a finished history and which
of them an action can reach, `planner` builds the `OpPlan` (capture/plan.py) that every
executor honours (the plan's `first_difference` checks that a run made the ops it
expected), and `random_ops` is the one list of ops that draw random numbers.
"""
