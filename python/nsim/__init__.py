"""nsim — cycle-approximate AWS NeuronCore simulator (Python API).

    import nsim
    outputs, profile = nsim.simulate_json("examples/softmax_2x128x512.json", inputs={"x": x})
    print(profile.total_time_ns, outputs["y"].dtype)

    y, profile = nsim.simulate(my_nki_kernel, x)             # every argument goes to the kernel
    y, profile = my_nki_kernel.options(config="trn1").simulate(x)
    with nsim.options(config="trn3", timing_only=True): ...   # defaults for the kernels run inside

The simulator core is the `_nsim` extension (see python/README.md). When it is not built, importing
nsim still works, but the simulator entry points raise ImportError, and so does tracing a kernel: the ISA
tables the tracer uses (opcodes, slots, dtypes, ALU ops) come from the extension (nsim._isa).
"""
__version__ = "0.1.0"

try:
    from nsim._core import (  # noqa: F401
        AccessError,
        ConfigError,
        InternalError,
        KernelError,
        NotSupportedError,
        NkiValidationError,
        NsimError,
        OperandError,
        Profile,
        ProfileComparison,
        act_funcs,
        alu_ops,
        check_json,
        disasm_json,
        dtypes,
        effective_config,
        LoadedKernel,
        error_class,
        load_kernel,
        op_table,
        simulate_json,
        version,
    )

    from nsim.analysis import Analysis, analyze  # noqa: F401

    core_available = True
    _core_import_error = None
except ImportError as _e:  # the extension is not built
    core_available = False
    _core_import_error = _e

    def __getattr__(name):
        if name in ("NsimError", "ConfigError", "AccessError", "OperandError", "KernelError", "NotSupportedError",
                    "InternalError", "NkiValidationError",
                    "Profile", "ProfileComparison", "simulate_json", "load_kernel", "LoadedKernel", "check_json", "disasm_json", "effective_config",
                    "op_table", "alu_ops", "act_funcs", "dtypes", "version", "error_class", "analyze", "Analysis"):
            raise ImportError("nsim.{} needs the _nsim extension: {}".format(name, _core_import_error))
        raise AttributeError("module 'nsim' has no attribute '{}'".format(name))


from nsim._kernel import options, simulate  # noqa: E402,F401  (the kernel API of both NKI dialects)


def trace_kernel(kernel, *args, **kwargs):
    """Trace an NKI kernel (nsim.nki.jit) with these arguments and return its kernel.json dict."""
    from nsim.nki import trace_kernel as _trace

    return _trace(kernel, *args, **kwargs)
