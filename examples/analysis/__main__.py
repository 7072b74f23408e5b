"""`python -m examples.analysis`: read Capture files, write summary.md and summary.png.

    # Azurite / the sandbox
    python -m examples.analysis --connection-string "$AZURITE" --container eventhub-capture --out out/
    # Azure: Entra ID (az login or a managed identity) with Storage Blob Data Reader on the container
    python -m examples.analysis --account-url https://<account>.blob.core.windows.net \
        --container eventhub-capture --out out/
    # files already downloaded (`make demo DEMO_ARGS=--capture` copies them to .demo/capture, runs
    # this form on them and prints the command)
    python -m examples.analysis --dir ./capture --out out/
    # also export the envelopes for `se-policy whatif --from envelopes.jsonl`
    python -m examples.analysis --dir ./capture --out out/ --export envelopes.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Tuple

from . import capture_files, questions, report

EXIT_USAGE = 2
EXIT_SOURCE = 3  # the files could not be read (storage unreachable, container missing, not Avro)


def _files(args: argparse.Namespace) -> Iterable[Tuple[str, bytes]]:
    if args.dir:
        return capture_files.directory_files(args.dir)
    from azure.storage.blob import BlobServiceClient

    # One retry, short backoff: a person is waiting; the SDK's default (3 retries from 15 s) takes a minute.
    retry = {"retry_total": 1, "initial_backoff": 1, "increment_base": 1}
    service: Any
    if args.connection_string:
        service = BlobServiceClient.from_connection_string(args.connection_string, **retry)
    else:
        from azure.identity import DefaultAzureCredential

        service = BlobServiceClient(args.account_url, credential=DefaultAzureCredential(), **retry)
    return capture_files.container_files(service.get_container_client(args.container), args.prefix)


def _source(args: argparse.Namespace) -> str:
    if args.dir:
        return f"Capture files in {args.dir}"
    where = "Azurite (connection string)" if args.connection_string else args.account_url
    return f"Capture container {args.container}/{args.prefix} in {where}"


def run(args: argparse.Namespace) -> report.Answers:
    found = capture_files.envelopes(_files(args))
    seen = questions.sightings(found.items)
    times = sorted(str(e.get("time")) for e in found.items if e.get("time"))
    provenance = report.Provenance(
        source=_source(args), files=found.files, records=found.records, envelopes=len(found.items),
        duplicates=found.duplicates, unreadable=found.unreadable, invalid=found.invalid,
        first=times[0] if times else "", last=times[-1] if times else "", time_scale=args.time_scale)
    answers = report.Answers(
        notice=questions.by_type(questions.notice_seconds(seen)),
        approval_lead=questions.by_type(questions.approval_lead_seconds(found.items, seen)),
        per_group_week=questions.events_per_group_week(seen, args.group_by),
        group_by=args.group_by,
        provenance=provenance,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    text = report.markdown(answers)
    (args.out / "summary.md").write_text(text)
    report.plot(answers, args.out / "summary.png")
    print(text)
    if args.export is not None:
        args.export.write_text("".join(capture_files.export_lines(found)))
        print(f"exported {len(found.items)} envelope(s) to {args.export} "
              f"(se-policy whatif POLICY --from {args.export})")
    print(f"{found.files} file(s), {found.records} record(s): {len(found.items)} envelope(s), "
          f"{found.duplicates} duplicate(s) dropped, {found.unreadable} unreadable, {found.invalid} invalid; "
          f"wrote {args.out / 'summary.md'} and {args.out / 'summary.png'}")
    return answers


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.analysis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--connection-string", help="storage connection string (Azurite/sandbox)")
    source.add_argument("--account-url", help="https://<account>.blob.core.windows.net (Entra ID)")
    source.add_argument("--dir", type=Path, help="a local directory of downloaded .avro files")
    parser.add_argument("--container", default="eventhub-capture",
                        help="capture container (default %(default)s)")
    parser.add_argument("--prefix", default="", help="only blobs under this prefix, e.g. <namespace>/<hub>/")
    parser.add_argument("--group-by", default="scaleSet",
                        help="scaleSet | placementGroup | zone | resourceGroup | tag:<name> "
                             "(default %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("analysis-out"), help="output directory")
    parser.add_argument("--export", type=Path, default=None,
                        help="also write the envelopes as JSON lines with their enqueued times "
                             "(what se-policy whatif --from reads)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="simulated seconds per real second of the clock the events ran on: 1 on Azure "
                             "(default), 5 for `make demo` captures; stated in the summary and the figure")
    args = parser.parse_args(argv)
    if args.time_scale <= 0:
        parser.error("--time-scale must be above 0")
    try:
        questions.group_of({}, args.group_by)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        run(args)
    except Exception as exc:  # noqa: BLE001 - one actionable line, never a traceback
        print(f"error: could not read the capture files: {type(exc).__name__}: {str(exc).splitlines()[0]}",
              file=sys.stderr)
        return EXIT_SOURCE
    return 0


if __name__ == "__main__":
    sys.exit(main())
