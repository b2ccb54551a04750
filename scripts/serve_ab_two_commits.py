"""`tandem serve` from this tree against `tandem serve` from another commit's tree, alternating
level by level as scripts/serve_ab.py runs any pair (the other tree's code runs in its server:
PYTHONPATH=OTHER/src). It tells a change's cost from the VM's noise, which moves one level by
±5-10% on these 2-core VMs.

    rm -rf /tmp/old && mkdir /tmp/old && git archive cb233f1 | tar -x -C /tmp/old
    .venv/bin/python scripts/serve_ab_two_commits.py --other-src /tmp/old/src \\
        --configs tandem-spec,tandem-other --concurrency 1 --requests 16 --repeats 4 \\
        --max-tokens-spread 25 --threads 2

Every other option is serve_ab.py's; the config `tandem-other` is `tandem-spec` from the other tree.
"""

import sys
import types
from pathlib import Path

from tandem.bench.serve import server_kinds
from tandem.bench.serve import settings as bench_settings
from tandem.bench.serve.server_kinds import SERVER_KINDS, TandemSpecServer

SERVE_AB = Path(__file__).with_name("serve_ab.py")


def main() -> None:
    args = sys.argv[1:]
    if "--other-src" not in args or args.index("--other-src") + 1 >= len(args):
        sys.exit("give --other-src DIR: the src folder of the other commit's tree")
    at = args.index("--other-src")
    other_src = Path(args[at + 1]).resolve()
    if not (other_src / "tandem" / "cli" / "main.py").is_file():
        sys.exit(f"{other_src} holds no tandem package (tandem/cli/main.py)")
    del args[at:at + 2]

    class TandemOtherServer(TandemSpecServer):
        label = "tandem-other"
        notes = f"`tandem serve` from {other_src}"

        def command(self, launch, port):
            return ["env", f"PYTHONPATH={other_src}", *super().command(launch, port)]

    kinds = types.MappingProxyType({**SERVER_KINDS, "tandem-other": TandemOtherServer})
    server_kinds.SERVER_KINDS = bench_settings.SERVER_KINDS = kinds
    source = SERVE_AB.read_text().replace("from tandem.bench.serve.server_kinds import SERVER_KINDS",
                                          "SERVER_KINDS = KINDS")
    sys.argv = [str(SERVE_AB), *args]
    exec(compile(source, str(SERVE_AB), "exec"), {"__name__": "__main__", "__file__": str(SERVE_AB), "KINDS": kinds})


if __name__ == "__main__":
    main()
