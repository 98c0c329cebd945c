"""Screenshots of the dashboard pages of a gate's runs, served from the run database it left.

A GPU host's `scripts/gpu/gate_e2e.sh run` copies its SQLite database into its output folder;
this serves that database read-only here (no worker, the packaged profiles) and photographs the
runs list and each run's page and samples in headless Chromium.

    python scripts/gpu/gate_screenshots.py OUT/kvcanary.db docs/img [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

PORT = 8093


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--prefix", default="gpu-gate")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        database = Path(tmp) / "kvcanary.db"
        shutil.copy(args.database, database)  # the copy may be migrated; the original stays as it came
        env = {**os.environ, "KVCANARY_DATA_DIR": tmp, "KVCANARY_DATABASE_URL": f"sqlite:///{database}",
               "KVCANARY_START_WORKER": "false", "KVCANARY_PORT": str(PORT)}  # fmt: skip
        server = subprocess.Popen([sys.executable, "-m", "service", "serve"], env=env)
        url = f"http://127.0.0.1:{PORT}"
        try:
            for _ in range(120):
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            runs = httpx.get(f"{url}/api/v1/runs", params={"limit": 100}).json()["items"]
            pages = [("runs", "/runs")]
            for run in sorted(runs, key=lambda r: r["id"]):
                pages += [(f"run-{run['id']}", f"/runs/{run['id']}"), (f"run-{run['id']}-samples",
                          f"/runs/{run['id']}/samples")]  # fmt: skip
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1400, "height": 1500})
                for name, path in pages:
                    page.goto(url + path)
                    page.wait_for_load_state("networkidle")
                    shot = args.out / f"{args.prefix}-{name}.png"
                    page.screenshot(path=str(shot))  # the top of the page: metrics and verdicts
                    print(shot)
                browser.close()
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
