#!/usr/bin/env python3
"""Keeps the conformance matrix in README.md generated from a real `pagoda conformance` run.

  readme_matrix.py write PAGODA README.md   run the full grid, write its table into the README
  readme_matrix.py check PAGODA README.md   run the full grid, fail unless it passed and the
                                            README's table is exactly the one it printed

The table sits between the markers <!-- conformance:begin --> and <!-- conformance:end -->.
The run covers the CPU backends CI can execute (reference, cpu, their hybrid, and amx, whose
oneDNN matmuls run without AMX too, more slowly; the mutant always runs and must be caught)."""
import pathlib
import subprocess
import sys
import tempfile

BEGIN, END = "<!-- conformance:begin -->", "<!-- conformance:end -->"
BACKENDS = "reference,cpu,reference+cpu,amx"


def run_grid(pagoda: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "matrix.md"
        proc = subprocess.run([pagoda, "conformance", "--backends", BACKENDS, "--seed", "1234",
                               "--output", str(out)], capture_output=True, text=True)
        sys.stdout.write(proc.stdout[-3000:])
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"readme_matrix: pagoda conformance failed (exit {proc.returncode})")
        rows = [l for l in out.read_text().splitlines() if l.startswith("|")]
    return "\n".join(rows)


def split(readme: str):
    if BEGIN not in readme or END not in readme:
        raise SystemExit("readme_matrix: README has no conformance markers")
    head, rest = readme.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    return head, body, tail


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in ("write", "check"):
        print(__doc__)
        return 2
    mode, pagoda, readme_path = sys.argv[1:]
    table = run_grid(pagoda)
    readme = pathlib.Path(readme_path).read_text()
    head, body, tail = split(readme)
    if mode == "write":
        pathlib.Path(readme_path).write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
        print("readme_matrix: README updated")
        return 0
    if body.strip() != table.strip():
        print("readme_matrix: README matrix differs from this run; run "
              "`python3 tools/readme_matrix.py write build/pagoda README.md`")
        print("--- README\n" + body.strip() + "\n--- run\n" + table)
        return 1
    print("readme_matrix: README matrix matches the full-grid run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
