"""Turn the ServeGen Bailian aggregate into one ``time,rps`` trace per model.

ServeGen gives seconds from the start of its release and no date. Its own examples treat 72000 s
as 20:00, so the clock is local (China) time; we anchor day 0 at 2025-01-06 00:00 Asia/Shanghai
(2025-01-05T16:00:00Z). The weekday is therefore arbitrary. Windows whose summed rate is exactly
zero are gaps in the release (not idle traffic) and are left out, so the simulator sees them as
missing samples.

    python examples/traces/servegen_to_time_rps.py
"""

import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).parent
ANCHOR = datetime(2025, 1, 5, 16, 0, tzinfo=UTC)
MODELS = ("m-large", "m-mid", "m-small")


def main() -> None:
    with (HERE / "servegen_bailian_rate_10min.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for name in MODELS:
        out = HERE / f"servegen_{name}.csv"
        with out.open("w", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["time", "rps"])
            for row in rows:
                rate = float(row["rate_rps_sum"])
                if row["model"] != name or rate == 0.0:
                    continue
                when = ANCHOR + timedelta(seconds=int(row["window_start_s"]))
                writer.writerow([when.strftime("%Y-%m-%dT%H:%M:%SZ"), row["rate_rps_sum"]])
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
