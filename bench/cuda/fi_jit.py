"""FlashInfer's JIT with one ninja log per module, so parallel processes can compile it.

FlashInfer 0.5.3 builds each JIT module with `ninja -C <cached_ops> -f <cached_ops>/<module>/
build.ninja` (flashinfer/jit/cpp_ext.py run_ninja): every module shares the ninja log of
cached_ops/. run.sh's warm-up compiles the kernel modules in parallel processes, one per module
group; their ninja processes wrote that one log at once ("ninja: warning: premature end of file;
recovering"), lost entries, and the timed round after the warm-up rebuilt those modules (about
280 s of a 500 s device call at 1de75ef). isolate_ninja_logs() runs each module's ninja in its
own folder, cached_ops/.per_module/<module>/, holding a link <module> -> cached_ops/<module>:
the build file's outputs ($name/...) land in the same place, the compiled kernels are the same,
and each module keeps its own log. Call it after `import flashinfer`, before the first kernel.
"""
from pathlib import Path


def isolate_ninja_logs():
    from flashinfer.jit import core, cpp_ext  # noqa: PLC0415 - optional peer

    shared = cpp_ext.run_ninja
    if getattr(shared, "per_module_logs", False):
        return

    def run_ninja(workdir, ninja_file, verbose):
        module = Path(ninja_file).parent
        if module.parent.resolve() != Path(workdir).resolve():  # not one module's build file
            return shared(workdir, ninja_file, verbose)
        own = Path(workdir) / ".per_module" / module.name
        own.mkdir(parents=True, exist_ok=True)
        link = own / module.name
        if not link.is_symlink():
            link.symlink_to(module.resolve(), target_is_directory=True)
        return shared(own, ninja_file, verbose)

    run_ninja.per_module_logs = True
    cpp_ext.run_ninja = run_ninja
    core.run_ninja = run_ninja
