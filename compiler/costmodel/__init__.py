"""The cost model: per-GPU memory and step time of a layout, as named line items.

    from compiler.costmodel.evaluation import evaluate, evaluate_targets
    evaluate(problem, layout, *, gpu=None, target=None) -> Estimate | Rejection
    evaluate_targets(problem, layout) -> TargetEstimates (one Estimate per framework target, the binding one)

Modules (each small, each quantity a named function with its unit in the name):

* ``evaluation``   the entry points: evaluate, evaluate_targets, check_layout, find_gpu_option
* ``activations``  saved-tensor terms per layer (Korthikanti et al. 2022, generalised)
* ``memory``       model states under ZeRO/FSDP, activations in flight, buffers, allowances
* ``compute``      the FLOP convention and compute time at size-dependent efficiency
* ``comm``         collectives, groups and the links they cross
* ``pp_schedule``  pipeline-parallel schedule simulation (GPipe, 1F1B, interleaved 1F1B), bubble, in-flight
* ``stages``       which layers and parameters each pipeline stage holds
* ``step``         composition into the time breakdown and the Estimate
* ``context``      the per-(problem, layout, GPU) inputs, precision recipes, memoised per-layer costs
* ``parts``        the public door for the solver's lower bounds (compiler/solver/bounds.py)
* ``frameworks``   which cost profile a target names (the facts: compiler/targets/<name>/cost.py)
* ``efficiency``   compiler/data/physics.yaml (sourced) + compiler/data/efficiency.yaml (fitted), typed

Structural problems come back as ``Rejection`` with a stable code (compiler.rules, via ``check_layout``);
a layout that does not fit comes back as ``Rejection("out_of_memory")`` with the
breakdown and what would make it fit.

Nothing is imported here: importing one module (compiler.calibration.profile imports costmodel.efficiency)
must not import the whole cost model, nor make a circle through this file.
"""
