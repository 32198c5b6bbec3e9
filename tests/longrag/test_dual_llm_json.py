"""The optional ``chat_json`` of the LLM interface: OpenAI ``response_format`` on the wire, and the
plain-chat default for backends without schema support."""

from __future__ import annotations

import asyncio
import json

from longrag.dual.prompts import JUDGEMENT_SCHEMA, parse_judgement
from tests.fakes import ScriptedLLM
from tests.longrag.test_llm import MESSAGES, CannedServer, chat_body, client


def test_openai_chat_json_sends_json_schema_response_format():
    with CannedServer([(200, chat_body('{"status": true}'), 0)]) as srv:
        llm = client(srv.url)

        async def go():
            try:
                return await llm.chat_json(MESSAGES, schema=JUDGEMENT_SCHEMA, max_tokens=8)
            finally:
                await llm.aclose()

        res = asyncio.run(go())
    assert llm.supports_json_schema and parse_judgement(res.text) is True
    [req] = srv.requests
    rf = req["body"]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == JUDGEMENT_SCHEMA
    assert rf["json_schema"]["name"] == "judgement" and req["path"] == "/v1/chat/completions"
    assert json.loads(res.text) == {"status": True}


def test_default_chat_json_is_a_plain_chat():
    llm = ScriptedLLM(['{"status": false}'])
    res = asyncio.run(llm.chat_json(MESSAGES, schema=JUDGEMENT_SCHEMA, max_tokens=8))
    assert not llm.supports_json_schema and res.text == '{"status": false}'
    assert llm.calls[0]["kind"] == "chat" and llm.calls[0]["max_tokens"] == 8
