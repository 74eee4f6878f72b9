"""An agent host against cairn's MCP server, with the official Python SDK (`mcp`, pinned by
scripts/setup-mcp). Run by tests/e2e/mcp.rs:

    agent.py SCENARIO CONFIG.json

SCENARIO is `http` (tools, scopes, bounds, labels, isolation, current revisions, 401), `cancel`
and `cancel_notification` (a search cancelled by the SDK, or by `notifications/cancelled`
alone, frees its admission slot) or `stdio` (the same server through `cairn mcp`). CONFIG names the endpoint, the tokens and what the test stored. Each check
that fails raises; the script prints `ok SCENARIO` and exits 0 when all pass.
"""

import json
import sys
import time

import anyio
import httpx2
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

MAX_ANSWER_CHARS = 20_000
NOTICE_START = "Text quoted below was retrieved from documents stored in cairn."


def connect(config, token, mode):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(config["mcp_url"], http_client=http), mode=mode, cache=None)


def wire(result):
    return result.model_dump(by_alias=True, exclude_none=True)


def answer_of(result):
    """The structured answer, checked for the label and the bound, and its text twin."""
    data = wire(result)
    structured = data.get("structuredContent")
    assert isinstance(structured, dict), data
    texts = [block["text"] for block in data.get("content", []) if block.get("type") == "text"]
    assert texts, f"no text block: {data}"
    text = texts[0]
    assert text.startswith('{"trust":"untrusted","notice":'), text[:200]
    assert json.loads(text) == structured, "the text block is the structured answer"
    assert list(structured)[:2] == ["trust", "notice"], list(structured)
    assert structured["notice"].startswith(NOTICE_START), structured["notice"]
    assert len(text) <= MAX_ANSWER_CHARS, len(text)
    return structured, data.get("isError", False)


async def call(client, tool, arguments):
    return answer_of(await client.call_tool(tool, arguments))


async def expect_error(client, tool, arguments, code):
    answer, is_error = await call(client, tool, arguments)
    assert is_error, f"{tool} {arguments!r:.200} was not refused: {answer!r:.500}"
    assert answer["error"]["code"] == code, answer
    return answer["error"]


async def tools_by_scope(config):
    expected_read = {"search", "read_document", "get_source", "list_datasets"}
    for mode in ("2026-07-28", "legacy"):
        async with connect(config, config["tokens"]["search"], mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == expected_read, (mode, sorted(tools))
            for tool in tools.values():
                data = tool.model_dump(by_alias=True, exclude_none=True)
                assert data["inputSchema"]["type"] == "object", data
                assert data["outputSchema"]["required"] == ["trust", "notice"], data
                notes = data["annotations"]
                assert notes["readOnlyHint"] is True and notes["destructiveHint"] is False, data
                assert notes["openWorldHint"] is False and notes["idempotentHint"] is True, data
            search = tools["search"].model_dump(by_alias=True)["inputSchema"]["properties"]
            assert search["top_k"]["maximum"] == 10 and search["top_k"]["default"] == 3, search
            assert search["query"]["maxLength"] == 1000, search
            # Not listed, and refused if called anyway.
            error = await expect_error(
                client, "ingest", {"dataset": "docs", "source_key": "x", "content": "x"}, "forbidden"
            )
            assert "ingest" in error["message"], error
    async with connect(config, config["tokens"]["docs_rw"], "legacy") as client:
        tools = {tool.name: tool.model_dump(by_alias=True, exclude_none=True) for tool in (await client.list_tools()).tools}
        assert set(tools) == expected_read | {"ingest", "delete_source"}, sorted(tools)
        assert tools["delete_source"]["annotations"]["destructiveHint"] is True
        assert tools["ingest"]["annotations"]["readOnlyHint"] is False
        assert "approval" in tools["ingest"]["description"], tools["ingest"]["description"]
        assert "confirm" in tools["delete_source"]["inputSchema"]["required"]
        templates = await client.list_resource_templates()
        uris = sorted(t.uri_template for t in templates.resource_templates)
        assert uris == ["cairn://revision/{revision_id}", "cairn://source/{dataset}/{+source_key}"], uris
        listed = await client.list_resources()
        assert listed.resources == [], "the corpus is never listed"


async def bounds_hold_for_hostile_arguments(config):
    async with connect(config, config["tokens"]["search"], "2026-07-28") as client:
        for arguments, code in [
            ({"query": "lease", "top_k": 10_000}, "invalid_arguments"),
            ({"query": "lease", "snippet_chars": 1_000_000}, "invalid_arguments"),
            ({"query": "lease " * 20_000}, "invalid_arguments"),
            ({"query": "lease", "budget_ms": 10}, "invalid_budget"),
            ({"query": "lease", "unknown": 1}, "invalid_arguments"),
            ({"query": "lease", "mode": "psychic"}, "invalid_mode"),
            ({"query": "lease", "filter": {"field": "colour", "eq": "red"}}, "filter_unknown_field"),
            ({"query": "lease", "filter": {"must": [{"field": "tags", "any": ["x"] * 5000}]}}, "filter_too_large"),
        ]:
            error = await expect_error(client, "search", arguments, code)
            assert len(error["message"]) < 600, error
        # The widest legal answer stays within every bound, and says what it cut.
        answer, is_error = await call(client, "search", {"query": "lease heartbeat", "top_k": 10, "snippet_chars": 1000, "mode": "lexical"})
        assert not is_error, answer
        hits = answer["hits"]
        assert len(hits) + answer["omitted"] >= 10, answer
        assert sum(len(hit["text"].rstrip("…")) for hit in hits) <= 6000, [len(h["text"]) for h in hits]
        assert any(hit["truncated"] for hit in hits), "long passages are cut, and say so"
        for hit in hits:
            for key in ("dataset", "source_key", "revision_id", "receipt_state", "accepted_at", "accepted_by", "section", "page", "chunk_index", "passage_index", "generation"):
                assert key in hit, (key, hit)
            assert hit["accepted_by"].startswith("token:"), hit
            assert hit["accepted_at"].endswith("Z"), hit
        # A filter keeps only what matches it.
        only = hits[0]["source_key"]
        answer, is_error = await call(client, "search", {"query": "lease heartbeat", "top_k": 10, "mode": "lexical", "filter": {"field": "source_key", "eq": only}})
        assert not is_error, answer
        assert answer["hits"] and {hit["source_key"] for hit in answer["hits"]} == {only}, answer
        # Facets: counts over every matching document, beside the hits.
        answer, is_error = await call(client, "search", {"query": "lease heartbeat", "mode": "lexical", "facets": ["media_type"], "filter": {"field": "source_key", "eq": only}})
        assert not is_error, answer
        assert answer["facets"][0]["field"] == "media_type" and answer["facets"][0]["sources"] == 1, answer
        assert sum(value["count"] for value in answer["facets"][0]["values"]) == 1, answer
        await expect_error(client, "search", {"query": "lease", "facets": ["colour"]}, "facet_unknown_field")
        # Defaults: three hits.
        answer, _ = await call(client, "search", {"query": "lease heartbeat", "mode": "lexical"})
        assert len(answer["hits"]) == 3, len(answer["hits"])
        # Reading on from a hit: windows with a next offset, within the bound.
        first = hits[0]
        window, is_error = await call(client, "read_document", {"revision_id": first["revision_id"], "max_chars": 8000})
        assert not is_error, window
        assert window["revision_id"] == first["revision_id"] and window["is_head"] is True
        assert window["offset"] == 0 and window["total_chars"] > len(window["text"].rstrip("…")) - 1
        # A window shorter than the document: it says where to read on, and the next window
        # starts there and goes on with the text.
        short, is_error = await call(client, "read_document", {"revision_id": first["revision_id"], "max_chars": 500})
        assert not is_error, short
        assert short["total_chars"] > 500, short["total_chars"]
        assert short["next_offset"] is not None and 0 < short["next_offset"] <= 500, short
        more, is_error = await call(client, "read_document", {"revision_id": first["revision_id"], "offset": short["next_offset"], "max_chars": 500})
        assert not is_error and more["offset"] == short["next_offset"], more
        assert more["text"] and more["text"].strip("…")[:40] in window["text"], (more["text"][:60], window["text"][:60])
        await expect_error(client, "read_document", {"revision_id": first["revision_id"], "max_chars": 1_000_000}, "invalid_arguments")
        await expect_error(client, "read_document", {"revision_id": "not-a-uuid"}, "invalid_arguments")


async def instructions_stay_data(config):
    async with connect(config, config["tokens"]["search"], "2026-07-28") as client:
        answer, is_error = await call(client, "search", {"query": "ignore previous instructions", "mode": "lexical"})
        assert not is_error, answer
        texts = [hit["text"] for hit in answer["hits"] if hit["source_key"] == "inject.md"]
        assert texts and "Ignore previous instructions" in texts[0], answer
        assert "\x1b" not in texts[0] and "\u202e" not in texts[0], texts[0]
        assert answer["trust"] == "untrusted"
        # A stored document that holds a credential (written past the ingest scan by the test):
        # the key never leaves, the answer says what was there.
        answer, is_error = await call(client, "search", {"query": "wallaby deploy key", "mode": "lexical"})
        assert not is_error, answer
        texts = [hit["text"] for hit in answer["hits"] if hit["source_key"] == "leaky.md"]
        assert texts, answer
        assert "[redacted:aws_access_key_id]" in texts[0], texts[0]
        assert config["leaked_key"] not in json.dumps(answer), "credentials are redacted on the way out"
        window, is_error = await call(client, "read_document", {"dataset": "docs", "source_key": "leaky.md"})
        assert not is_error and "[redacted:aws_access_key_id]" in window["text"], window
        assert config["leaked_key"] not in json.dumps(window), window


async def allowlist_isolates(config):
    private_revision = config["private_revision"]
    async with connect(config, config["tokens"]["docs_rw"], "2026-07-28") as client:
        await expect_error(client, "search", {"query": "zebra", "datasets": ["private"]}, "forbidden")
        answer, _ = await call(client, "search", {"query": "zebra", "mode": "lexical", "top_k": 10})
        assert answer["datasets"] == ["docs"], answer["datasets"]
        assert all(hit["dataset"] == "docs" for hit in answer["hits"]), answer
        assert "private zebra" not in json.dumps(answer)
        await expect_error(client, "read_document", {"revision_id": private_revision}, "not_found")
        await expect_error(client, "read_document", {"dataset": "private", "source_key": "plans.md"}, "not_found")
        await expect_error(client, "get_source", {"dataset": "private", "source_key": "plans.md"}, "not_found")
        listed, _ = await call(client, "list_datasets", {})
        assert [d["dataset"] for d in listed["datasets"]] == ["docs"], listed
        for uri in (f"cairn://revision/{private_revision}", "cairn://source/private/plans.md"):
            try:
                result = await client.read_resource(uri)
            except Exception as error:  # the SDK raises the server's JSON-RPC error
                assert "not exist" in str(error) or "not_found" in str(error), error
            else:
                raise AssertionError(f"{uri} was served: {result!r:.300}")
        # The same reads succeed in the token's own dataset, through a resource too.
        own = await client.read_resource("cairn://source/docs/inject.md")
        contents = own.model_dump(by_alias=True)["contents"][0]
        body = json.loads(contents["text"])
        assert body["trust"] == "untrusted" and body["source_key"] == "inject.md", body
    # A token for every dataset sees both, and the answer names them.
    async with connect(config, config["tokens"]["search"], "2026-07-28") as client:
        answer, _ = await call(client, "search", {"query": "zebra", "mode": "lexical", "top_k": 10})
        assert sorted(answer["datasets"]) == ["docs", "private"], answer["datasets"]
        empty, _ = await call(client, "search", {"query": "nothingmatchesthis", "mode": "lexical"})
        assert empty["hits"] == [] and "no current document matched" in empty["note"], empty


async def readers_isolate(config):
    """A token that reads as user:alice: every tool answers bob's document as absent, and
    alice's own is found."""
    payroll = config["payroll_revision"]
    async with connect(config, config["tokens"]["alice"], "2026-07-28") as client:
        for mode in ("lexical", "auto"):
            answer, _ = await call(client, "search", {"query": "payroll", "mode": mode, "top_k": 10})
            keys = [hit["source_key"] for hit in answer["hits"]]
            assert "hr-payroll.md" not in keys and "payroll ledger" not in json.dumps(answer), answer
            if mode == "lexical":
                assert keys == ["alice-notes.md"], keys
        await expect_error(client, "read_document", {"revision_id": payroll}, "not_found")
        await expect_error(client, "read_document", {"dataset": "docs", "source_key": "hr-payroll.md"}, "not_found")
        await expect_error(client, "get_source", {"dataset": "docs", "source_key": "hr-payroll.md"}, "not_found")
        for uri in (f"cairn://revision/{payroll}", "cairn://source/docs/hr-payroll.md"):
            try:
                result = await client.read_resource(uri)
            except Exception as error:
                assert "not exist" in str(error) or "not_found" in str(error), error
            else:
                raise AssertionError(f"{uri} was served: {result!r:.300}")
        own, _ = await call(client, "get_source", {"dataset": "docs", "source_key": "alice-notes.md"})
        assert own["source_key"] == "alice-notes.md", own


async def hits_are_current_while_sources_change(config):
    """Supersede and delete a source through the API between searches: every hit is the head
    accepted last, and after the deletion the source is gone."""
    headers = {"Authorization": f"Bearer {config['tokens']['docs_rw']}"}
    async with httpx2.AsyncClient(base_url=config["base_url"], headers=headers) as http, connect(
        config, config["tokens"]["docs_rw"], "2026-07-28"
    ) as client:
        for version in range(6):
            response = await http.post("/v1/sources", json={"dataset": "docs", "source_key": "churn.md", "content": f"churning quokka version {version} " + "filler " * version})
            assert response.status_code == 202, response.text
            head = response.json()["source_revision_id"]
            answer, _ = await call(client, "search", {"query": "churning quokka", "mode": "lexical", "top_k": 10})
            found = [hit["revision_id"] for hit in answer["hits"] if hit["source_key"] == "churn.md"]
            assert found == [head], (version, found, head)
            window, _ = await call(client, "read_document", {"dataset": "docs", "source_key": "churn.md"})
            assert window["revision_id"] == head and f"version {version}" in window["text"], window
            source, _ = await call(client, "get_source", {"dataset": "docs", "source_key": "churn.md"})
            assert source["head"]["revision_id"] == head and source["job"]["state"], source
        # An older revision: a search-only token may not read it; docs_rw (ingest) may.
        before_deletion = time.time_ns() // 1000
        last = head
        await expect_error(client, "delete_source", {"dataset": "docs", "source_key": "churn.md", "confirm": "other.md", "reason": "test"}, "confirmation_mismatch")
        deleted, is_error = await call(client, "delete_source", {"dataset": "docs", "source_key": "churn.md", "confirm": "churn.md", "reason": "the agent test deletes it"})
        assert not is_error and deleted["receipt"]["tombstone"] is True, deleted
        answer, _ = await call(client, "search", {"query": "churning quokka", "mode": "lexical", "top_k": 10})
        assert not [hit for hit in answer["hits"] if hit["source_key"] == "churn.md"], answer
        await expect_error(client, "read_document", {"dataset": "docs", "source_key": "churn.md"}, "source_deleted")
        stored, is_error = await call(client, "ingest", {"dataset": "docs", "source_key": "agent-note.md", "content": "# Note\n\nStored by an agent.", "media_type": "text/markdown"})
        assert not is_error and stored["receipt"]["status"] == "queued_not_confirmed", stored
        await expect_error(client, "ingest", {"dataset": "private", "source_key": "x.md", "content": "x"}, "forbidden")
        await expect_error(client, "ingest", {"dataset": "docs", "source_key": "k.md", "content": "key AKIAIOSFODNN7EXAMPLE"}, "secret_detected")
        # `ingest` may name the readers, recorded with the acceptance; a malformed one is refused.
        kept, is_error = await call(client, "ingest", {"dataset": "docs", "source_key": "agent-private.md", "content": "kept for two readers", "readers": ["user:carol", "group:hr"]})
        assert not is_error, kept
        access = await http.get("/v1/sources/access", params={"dataset": "docs", "source_key": "agent-private.md"})
        assert access.status_code == 200 and access.json()["readers"] == ["group:hr", "user:carol"], access.text
        await expect_error(client, "ingest", {"dataset": "docs", "source_key": "agent-open.md", "content": "x", "readers": ["carol"]}, "invalid_access")
        absent = await http.get("/v1/sources", params={"dataset": "docs", "source_key": "agent-open.md"})
        assert absent.status_code == 404, absent.text
        # With `ingest`, a superseded revision of the token's dataset is readable, and says so.
        old, is_error = await call(client, "read_document", {"revision_id": config["superseded_revision"]})
        assert not is_error, old
        assert old["revision_id"] == config["superseded_revision"] and old["is_head"] is False, old
        assert "first words" in old["text"], old
    async with connect(config, config["tokens"]["search"], "2026-07-28") as client:
        old = config["superseded_revision"]
        error = await expect_error(client, "read_document", {"revision_id": old}, "revision_not_current")
        assert "dataset" in error["message"], error
        # Searched at a point in time, the deleted source's last version is found, and readable
        # at that point (only there).
        answer, _ = await call(client, "search", {"query": "churning quokka", "mode": "lexical", "top_k": 10, "valid_at": before_deletion})
        found = [hit["revision_id"] for hit in answer["hits"] if hit["source_key"] == "churn.md"]
        assert found == [last], (found, last, answer)
        # Every revision has its passages: the lexical answer's history is complete.
        assert answer["history_partial"] is False and answer["history_gaps"] == [], answer
        window, is_error = await call(client, "read_document", {"revision_id": last, "valid_at": before_deletion})
        assert not is_error and "version 5" in window["text"], window
        await expect_error(client, "read_document", {"revision_id": last}, "revision_not_current")
        await expect_error(client, "read_document", {"revision_id": old, "valid_at": before_deletion}, "revision_not_current")


async def listen_reports_source_changes(config):
    """`subscriptions/listen` on source resources, fed from the events outbox: a new revision
    of a followed source is reported; a source the token's identity may not read is
    acknowledged but never reported; a URI that is not a cairn source is not honored."""
    watched = "cairn://source/docs/alice-watch.md"
    hidden = "cairn://source/docs/hr-payroll.md"
    writer = {"Authorization": f"Bearer {config['tokens']['docs_rw']}"}
    async with httpx2.AsyncClient(base_url=config["base_url"], headers=writer) as http, connect(
        config, config["tokens"]["alice"], "2026-07-28"
    ) as client:
        first = await http.post("/v1/sources", json={"dataset": "docs", "source_key": "alice-watch.md", "content": "watched, first"})
        assert first.status_code == 202, first.text
        async with client.listen(resource_subscriptions=[hidden, watched, "https://elsewhere.example/x"]) as sub:
            honored = sub.honored.resource_subscriptions or []
            assert watched in honored and hidden in honored, sub.honored
            assert "https://elsewhere.example/x" not in honored, sub.honored
            # The hidden source changes first: were it reported, it would come first.
            for key, content in (("hr-payroll.md", "payroll ledger, amended"), ("alice-watch.md", "watched, second")):
                response = await http.post("/v1/sources", json={"dataset": "docs", "source_key": key, "content": content})
                assert response.status_code == 202, response.text
            with anyio.fail_after(30):
                async for event in sub:
                    assert getattr(event, "uri", None) == watched, event
                    break
        # What the notification announced is what a read now answers.
        window, _ = await call(client, "read_document", {"dataset": "docs", "source_key": "alice-watch.md"})
        assert "watched, second" in window["text"], window


async def unauthenticated_is_401(config):
    async with httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        for headers in ({}, {"Authorization": "Bearer cairn_nottherealtoken"}):
            response = await http.post(config["mcp_url"], json=body, headers={"Accept": "application/json, text/event-stream", **headers})
            assert response.status_code == 401, (response.status_code, response.text)
            assert response.headers.get("www-authenticate", "").startswith("Bearer"), response.headers
            assert response.json()["code"] == "unauthenticated"
        # A request naming another host (DNS rebinding) is refused.
        response = await http.post(config["mcp_url"], json=body, headers={"Accept": "application/json, text/event-stream", "Host": "evil.example", "Authorization": f"Bearer {config['tokens']['search']}"})
        assert response.status_code == 403, (response.status_code, response.text)
        # A browser page's request (it carries an Origin) is refused.
        response = await http.post(config["mcp_url"], json=body, headers={"Accept": "application/json, text/event-stream", "Origin": "https://evil.example", "Authorization": f"Bearer {config['tokens']['search']}"})
        assert response.status_code == 403, (response.status_code, response.text)


async def scenario_http(config):
    await tools_by_scope(config)
    await bounds_hold_for_hostile_arguments(config)
    await instructions_stay_data(config)
    await allowlist_isolates(config)
    await readers_isolate(config)
    await hits_are_current_while_sources_change(config)
    await listen_reports_source_changes(config)
    await unauthenticated_is_401(config)


async def scenario_cancel(config):
    """The server admits one search at a time; the test armed a slow lexical query. Cancelling
    the slow search must free the slot: the next search is admitted at once."""
    async with connect(config, config["tokens"]["search"], "2026-07-28") as client:
        scope = anyio.CancelScope()
        finished = []

        async def slow():
            with scope:
                await client.call_tool("search", {"query": "zebra", "mode": "lexical", "budget_ms": 20_000})
                finished.append(True)

        async with anyio.create_task_group() as group:
            group.start_soon(slow)
            await anyio.sleep(1.0)
            assert not finished, "the armed search should still hold its slot"
            scope.cancel()
        assert not finished, "the slow search was cancelled, not answered"
        started = time.monotonic()
        answer, is_error = await call(client, "search", {"query": "zebra", "mode": "lexical", "budget_ms": 4_000})
        elapsed = time.monotonic() - started
        assert not is_error, answer
        assert elapsed < 2.0, f"the next search waited {elapsed:.2f} s for the cancelled one's slot"
        print(f"next search answered {elapsed * 1000:.0f} ms after the cancellation")


async def scenario_cancel_notification(config):
    """As `cancel`, with the connection kept open: only `notifications/cancelled`, posted on
    its own request, names the call."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    headers = {
        "Authorization": f"Bearer {config['tokens']['search']}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
    }
    slow_call = {"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "search", "arguments": {"query": "zebra", "mode": "lexical", "budget_ms": 20_000}, "_meta": meta}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 77, "reason": "the user moved on"}}
    timings = {}
    async with httpx2.AsyncClient(timeout=30) as http:

        async def slow_raw():
            started = time.monotonic()
            await http.post(config["mcp_url"], json=slow_call, headers={**headers, "Mcp-Method": "tools/call", "Mcp-Name": "search"})
            timings["slow"] = time.monotonic() - started

        async with anyio.create_task_group() as group:
            group.start_soon(slow_raw)
            await anyio.sleep(1.0)
            assert "slow" not in timings, "the armed search should still be running"
            response = await http.post(config["mcp_url"], json=cancel, headers={**headers, "Mcp-Method": "notifications/cancelled"})
            assert response.status_code == 202, (response.status_code, response.text)
            async with connect(config, config["tokens"]["search"], "2026-07-28") as client:
                started = time.monotonic()
                answer, is_error = await call_tool_answer(client)
                elapsed = time.monotonic() - started
        assert not is_error, answer
        assert elapsed < 2.0, f"the next search waited {elapsed:.2f} s: the cancellation did not free the slot"
        assert timings["slow"] < 5.0, f"the cancelled call ran on for {timings['slow']:.1f} s"
        print(f"notifications/cancelled: next search in {elapsed * 1000:.0f} ms; the cancelled call ended after {timings['slow']:.1f} s")


async def call_tool_answer(client):
    return await call(client, "search", {"query": "zebra", "mode": "lexical", "budget_ms": 4_000})


async def scenario_stdio(config):
    params = StdioServerParameters(
        command=config["cairn"],
        args=["mcp", "--server", config["base_url"]],
        env={"CAIRN_TOKEN": config["tokens"]["search"], "PATH": "/usr/bin:/bin"},
    )
    for mode in ("auto", "legacy"):
        async with Client(params, mode=mode, cache=None) as client:
            tools = sorted(tool.name for tool in (await client.list_tools()).tools)
            assert tools == ["get_source", "list_datasets", "read_document", "search"], tools
            answer, is_error = await call(client, "search", {"query": config["stdio_query"], "top_k": 3})
            assert not is_error, answer
            assert answer["hits"], answer
            hit = answer["hits"][0]
            assert hit["receipt_state"] == "searchable" and hit["generation"], hit
            window, _ = await call(client, "read_document", {"revision_id": hit["revision_id"]})
            assert window["revision_id"] == hit["revision_id"], window


def main():
    scenario, path = sys.argv[1], sys.argv[2]
    with open(path) as handle:
        config = json.load(handle)
    runner = {
        "http": scenario_http,
        "cancel": scenario_cancel,
        "cancel_notification": scenario_cancel_notification,
        "stdio": scenario_stdio,
    }[scenario]
    anyio.run(runner, config)
    print(f"ok {scenario}")


if __name__ == "__main__":
    main()
