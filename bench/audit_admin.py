"""Section 6: the audit admin on many records. The admin signed in over HTTP, the audit list and its filtered,
searched and older pages, the overview, each loaded first and then warm; and `audit_verify` over every record."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from bench.sections import Sizes, connection
from bench.server import BenchServer, log
from bench.stats import summary
from tests.live import LiveServer


class AdminBrowser:
    """The admin signed in over HTTP (login form with its CSRF token), a keep-alive connection with the cookies."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.http = connection(server)
        self.cookies: dict[str, str] = {}

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        cookie = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        return {**({"Cookie": cookie} if cookie else {}), **(extra or {})}

    async def get(self, path: str) -> tuple[int, bytes]:
        response = await self.http.request("GET", path, self._headers())
        self._keep_cookies(response.headers.get("set-cookie-all", ""))
        return response.status, response.body

    def _keep_cookies(self, header: str) -> None:
        for cookie in filter(None, header.split("\n")):
            name, _, rest = cookie.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]

    async def login(self) -> None:
        status, page = await self.get("/admin/login/")
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if status != 200 or token is None:
            raise AssertionError(f"no login form ({status})")
        form = urlencode({
            "csrfmiddlewaretoken": token.group(1).decode(), "username": "admin",
            "password": self.server.admin_password, "next": "/admin/",
        }).encode()  # fmt: skip
        headers = self._headers(
            {"Content-Type": "application/x-www-form-urlencoded", "Referer": f"{self.server.url}/admin/login/"}
        )
        response = await self.http.request("POST", "/admin/login/", headers, form)
        self._keep_cookies(response.headers.get("set-cookie-all", ""))
        if response.status != 302 or "sessionid" not in self.cookies:
            raise AssertionError(f"admin login failed ({response.status})")

    async def load(self, path: str, expect: bytes) -> float:
        began = time.perf_counter()
        status, body = await self.get(path)
        elapsed = time.perf_counter() - began
        if status != 200 or expect not in body:
            raise AssertionError(f"{path}: HTTP {status}, {expect!r} not in the page")
        return elapsed


ADMIN_LIST = "/admin/audit/auditrecord/"


def admin_page_paths(older_page: int) -> dict[str, tuple[str, bytes]]:
    """The pages timed besides the plain list: (path, a piece of the page that shows it worked)."""
    week_ago = (datetime.now(UTC) - timedelta(days=7)).date().isoformat()
    return {
        "list_filtered": (ADMIN_LIST + "?tool=file_read", b"file_read"),
        "list_exit_code": (ADMIN_LIST + "?exit_code=1", b"result_list"),  # read from the finished records, no index
        "list_last_7_days": (ADMIN_LIST + f"?created_at__gte={week_ago}", b"result_list"),
        "list_search": (ADMIN_LIST + "?q=pytest", b"pytest"),
        "list_search_no_match": (ADMIN_LIST + "?q=no-such-words-anywhere", b"Showing none"),
        "list_search_all_no_match": (ADMIN_LIST + "?q=no-such-words-anywhere&search_all=1", b"Showing none"),
        "list_older_page": (ADMIN_LIST + f"?p={older_page}", b"result_list"),
        "overview": ("/admin/audit/overview/", b"Calls per hour"),
    }


async def admin_pages(server: LiveServer, sizes: Sizes) -> dict[str, Any]:
    browser = AdminBrowser(server)
    await browser.login()
    try:
        results: dict[str, Any] = {"list_first_s": round(await browser.load(ADMIN_LIST, b"Tool calls"), 3)}
        results["list_warm"] = summary([await browser.load(ADMIN_LIST, b"Tool calls") for _ in range(sizes.page_loads)])
        for name, (path, expect) in admin_page_paths(sizes.older_page).items():
            first = await browser.load(path, expect)
            warm = [await browser.load(path, expect) for _ in range(sizes.page_loads)]
            results[name] = {**summary(warm), "first_ms": round(first * 1000, 1), "path": path}
        return results
    finally:
        await browser.http.close()


async def admin_section(server: BenchServer, sizes: Sizes, records: int) -> dict[str, Any]:
    pages = await admin_pages(server, sizes)
    log(f"bench: admin list page first {pages['list_first_s']} s, warm {pages['list_warm']['median_ms']} ms")
    verify = verify_timing(server)
    log(f"bench: audit_verify {verify['verify_s']} s")
    return {"records": records, "pages": pages, "verify": verify}


def verify_timing(server: BenchServer) -> dict[str, Any]:
    began = time.perf_counter()
    done = server.manage("audit_verify", "-v", "2", check=False)
    wall = time.perf_counter() - began
    took = re.search(r"Took ([0-9.]+) s", done.stderr)
    checked = re.search(r"OK: (\d+) records", done.stdout)
    return {
        "ok": done.returncode == 0,
        "records_checked": int(checked.group(1)) if checked else None,
        "verify_s": float(took.group(1)) if took else None,
        "command_wall_s": round(wall, 2),
        "output": (done.stdout or done.stderr).strip()[-300:],
    }
