"""The official OpenAI and Anthropic Python SDKs against `tandem serve` on loopback.

Three servers are started: the tiny Qwen2 fixture (random weights, the real engine) for plain
chat, streaming, token counting and errors; the scripted backend (`--test-script`, real
HTTP layer, templates and parsers, scripted model output) with an API key, for tool calls,
reasoning, the thinking budget, the Responses API and authentication errors; and the real
qwen2.5-coder-0.5b for an `openai-agents` tool-using run (agent_task.py). Prints "N passed,
N failed".
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import urllib.request

import anthropic
import openai

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
ANTHROPIC_TOOLS = [{
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
KEY = "sk-tandem-test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, args):
        self.port = free_port()
        self.proc = subprocess.Popen(args + ["--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.proc.stderr.read().decode(errors="replace"))
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("server did not come up")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def real_engine_tests(port):
    oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Hello there"}]

    def plain_chat():
        r = oc.chat.completions.create(model="tiny-qwen2", messages=msgs, max_tokens=8, temperature=0)
        assert r.object == "chat.completion" and r.model == "tiny-qwen2"
        assert r.choices[0].message.role == "assistant"
        assert isinstance(r.choices[0].message.content, str)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 0
        return r

    def streaming_matches_whole():
        whole = plain_chat().choices[0].message.content
        text, finish, usage = "", None, None
        for chunk in oc.chat.completions.create(model="tiny-qwen2", messages=msgs, max_tokens=8, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert text == whole, (text, whole)
        assert finish in ("stop", "length") and usage.completion_tokens >= 1

    def completions_endpoint():
        r = oc.completions.create(model="tiny-qwen2", prompt="Once upon", max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")

    def anthropic_plain_and_stream():
        # Newer SDKs dropped the sampling keywords; the server still reads them from the body.
        greedy = {"temperature": 0}
        m = ac.messages.create(model="tiny-qwen2", max_tokens=8, messages=msgs, extra_body=greedy)
        assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
        assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens > 0
        with ac.messages.stream(model="tiny-qwen2", max_tokens=8, messages=msgs, extra_body=greedy) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        assert streamed == m.content[0].text, (streamed, m.content[0].text)
        assert final.stop_reason == m.stop_reason
        n = ac.messages.count_tokens(model="tiny-qwen2", messages=msgs)
        assert n.input_tokens == m.usage.input_tokens, (n, m.usage)

    def errors_are_sdk_exceptions():
        for call, exc in [
            (lambda: oc.chat.completions.create(model="tiny-qwen2", messages=[], max_tokens=4), openai.BadRequestError),
            (lambda: oc.chat.completions.create(model="tiny-qwen2", messages=msgs, temperature=-1), openai.BadRequestError),
            (lambda: oc.chat.completions.create(model="gpt-9", messages=msgs), openai.NotFoundError),
            (lambda: oc.chat.completions.create(model="tiny-qwen2", messages=msgs, max_tokens=10**6), openai.BadRequestError),
            (lambda: ac.messages.create(model="tiny-qwen2", max_tokens=4, messages=[]), anthropic.BadRequestError),
            (lambda: ac.messages.create(model="tiny-qwen2", max_tokens=4, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]), anthropic.BadRequestError),
            (lambda: ac.messages.create(model="claude-9", max_tokens=4, messages=msgs), anthropic.NotFoundError),
        ]:
            try:
                call()
            except exc as e:
                assert e.status_code in (400, 404)
            else:
                raise AssertionError(f"expected {exc.__name__}")

    def responses_real_engine():
        r = oc.responses.create(model="tiny-qwen2", input=msgs[0]["content"], max_output_tokens=8, temperature=0)
        assert r.status in ("completed", "incomplete") and r.usage.output_tokens > 0, r
        # Cut by max_output_tokens, the stream ends with response.incomplete (the SDK's
        # get_final_response wants response.completed, so the events are read here).
        final, text = None, ""
        for ev in oc.responses.create(model="tiny-qwen2", input=msgs[0]["content"], max_output_tokens=8, temperature=0,
                                      stream=True):
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
        assert final is not None and final.status == r.status, final
        assert text == final.output_text == r.output_text, (text, final.output_text, r.output_text)
        assert final.usage.input_tokens == r.usage.input_tokens

    return [plain_chat, streaming_matches_whole, completions_endpoint, anthropic_plain_and_stream, errors_are_sdk_exceptions,
            responses_real_engine]


def scripted_tests(port):
    oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=KEY, max_retries=0)

    def openai_tool_conversation():
        messages = [{"role": "user", "content": "Paris weather?"}]
        r = oc.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "22C, sunny"})
        r2 = oc.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
        assert r2.choices[0].message.content == "It is 22C and sunny in Paris."
        assert r2.choices[0].finish_reason == "stop"

    def openai_streamed_tool_call():
        calls, finish, fragments = {}, None, 0
        for chunk in oc.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "Paris weather?"}],
                                                tools=TOOLS, stream=True):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "args": ""})
                    entry["args"] += tc.function.arguments or ""
                    fragments += bool(tc.function.arguments)
        assert finish == "tool_calls"
        assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
        assert json.loads(calls[0]["args"]) == {"city": "Paris"}
        assert fragments > 1, "arguments stream in several fragments"

    def openai_reasoning_content():
        r = oc.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "two plus two?"}])
        m = r.choices[0].message
        assert m.content == "The answer is 4."
        assert (m.model_extra or {}).get("reasoning_content") == "Two plus two is four.", m
        reasoning, content = "", ""
        for chunk in oc.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "two plus two?"}], stream=True):
            for c in chunk.choices:
                reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
                content += c.delta.content or ""
        assert (reasoning, content) == ("Two plus two is four.", "The answer is 4.")

    def openai_thinking_budget():
        r = oc.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "think long"}], max_tokens=50,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}, "max_thinking_tokens": 10})
        m = r.choices[0].message
        reasoning = m.model_extra["reasoning_content"]
        assert reasoning.startswith("one two th") and reasoning.endswith("now the answer."), reasoning
        assert m.content == "Budget answer."

    def anthropic_tool_conversation():
        messages = [{"role": "user", "content": "Paris weather?"}]
        m = ac.messages.create(model="scripted", max_tokens=200, tools=ANTHROPIC_TOOLS, messages=messages)
        assert m.stop_reason == "tool_use", m
        tool = [b for b in m.content if b.type == "tool_use"][0]
        assert tool.name == "get_weather" and tool.input == {"city": "Paris"} and tool.id.startswith("toolu_")
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "22C, sunny"}]})
        m2 = ac.messages.create(model="scripted", max_tokens=200, tools=ANTHROPIC_TOOLS, messages=messages)
        assert m2.stop_reason == "end_turn" and m2.content[0].text == "It is 22C and sunny in Paris."
        with ac.messages.stream(model="scripted", max_tokens=200, tools=ANTHROPIC_TOOLS, messages=messages[:1]) as s:
            final = s.get_final_message()
        streamed_tool = [b for b in final.content if b.type == "tool_use"][0]
        assert streamed_tool.input == {"city": "Paris"} and final.stop_reason == "tool_use", final

    def anthropic_thinking():
        with ac.messages.stream(model="scripted", max_tokens=100, messages=[{"role": "user", "content": "think long"}],
                                thinking={"type": "enabled", "budget_tokens": 10}) as s:
            final = s.get_final_message()
        assert final.content[0].type == "thinking" and final.content[0].thinking.endswith("now the answer."), final
        assert final.content[1].type == "text" and final.content[1].text == "Budget answer."

    def anthropic_stop_sequence():
        msgs = [{"role": "user", "content": "two plus two?"}]
        m = ac.messages.create(model="scripted", max_tokens=100, messages=msgs, stop_sequences=["nowhere", "is 4"])
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == "is 4", m
        assert m.content[-1].type == "text" and m.content[-1].text == "The answer ", m
        with ac.messages.stream(model="scripted", max_tokens=100, messages=msgs, stop_sequences=["is 4"]) as s:
            final = s.get_final_message()
        assert final.stop_reason == "stop_sequence" and final.stop_sequence == "is 4", final
        assert final.content[-1].text == "The answer ", final
        m = ac.messages.create(model="scripted", max_tokens=100, messages=msgs, stop_sequences=["nowhere"])
        assert m.stop_reason == "end_turn" and m.stop_sequence is None, m

    def auth_errors():
        bad_oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0)
        bad_ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="wrong", max_retries=0)
        for call, exc in [
            (lambda: bad_oc.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}]), openai.AuthenticationError),
            (lambda: bad_ac.messages.create(model="scripted", max_tokens=5, messages=[{"role": "user", "content": "hi"}]), anthropic.AuthenticationError),
            (lambda: oc.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                                tool_choice={"type": "function", "function": {"name": "nope"}}), openai.BadRequestError),
        ]:
            try:
                call()
            except exc:
                pass
            else:
                raise AssertionError(f"expected {exc.__name__}")

    def responses_api():
        # Plain, then continued server-side through previous_response_id.
        r = oc.responses.create(model="scripted", input="hi")
        assert r.status == "completed" and r.output_text == "Hello from the script.", r
        assert oc.responses.retrieve(r.id).output_text == r.output_text
        # A function tool round trip: the call, then its output as an input item.
        rtools = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
                   "parameters": TOOLS[0]["function"]["parameters"]}]
        r = oc.responses.create(model="scripted", input="Paris weather?", tools=rtools)
        calls = [i for i in r.output if i.type == "function_call"]
        assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}, r
        r2 = oc.responses.create(model="scripted", previous_response_id=r.id, tools=rtools,
                                 input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "22C, sunny"}])
        assert r2.output_text == "It is 22C and sunny in Paris.", r2
        # Streamed: the SDK assembles the events into the same response.
        text, kinds = "", set()
        with oc.responses.stream(model="scripted", input="two plus two?") as s:
            for ev in s:
                kinds.add(ev.type)
                if ev.type == "response.output_text.delta":
                    text += ev.delta
            final = s.get_final_response()
        assert text == final.output_text == "The answer is 4.", (text, final)
        assert {"response.created", "response.output_item.added", "response.completed"} <= kinds, kinds
        assert [i.type for i in final.output] == ["reasoning", "message"], final
        oc.responses.delete(final.id)
        try:
            oc.responses.retrieve(final.id)
        except openai.NotFoundError:
            pass
        else:
            raise AssertionError("a deleted response is still served")

    return [openai_tool_conversation, openai_streamed_tool_call, openai_reasoning_content, openai_thinking_budget,
            anthropic_tool_conversation, anthropic_thinking, anthropic_stop_sequence, auth_errors, responses_api]


def agent_tests(port):
    def openai_agents_two_tool_task():
        from agent_task import run_two_tool_task
        run_two_tool_task(port, "qwen2.5-coder-0.5b")

    oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                                    "required": ["city", "unit"], "additionalProperties": False}}}

    def structured_output_parses_into_the_schema():
        # The SDK's own parse helper: a pydantic model as response_format (strict json_schema).
        from pydantic import BaseModel

        class City(BaseModel):
            name: str
            country: str
            population: int
            coastal: bool

        for seed, temperature in [(1, 0.0), (2, 0.8), (3, 1.2)]:
            r = oc.chat.completions.parse(
                model="qwen2.5-coder-0.5b", seed=seed, temperature=temperature, max_tokens=120,
                messages=[{"role": "user", "content": "Describe Lisbon."}], response_format=City)
            assert r.choices[0].finish_reason == "stop", r
            city = r.choices[0].message.parsed
            assert isinstance(city, City) and isinstance(city.population, int), r
        r = oc.chat.completions.create(
            model="qwen2.5-coder-0.5b", temperature=0.9, seed=4, max_tokens=120,
            messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
            response_format={"type": "json_object"})
        assert isinstance(json.loads(r.choices[0].message.content), dict), r
        try:
            oc.chat.completions.create(model="qwen2.5-coder-0.5b", max_tokens=8,
                                       messages=[{"role": "user", "content": "x"}],
                                       extra_body={"guided_regex": "(unclosed"})
        except openai.BadRequestError as e:
            assert "grammar" in str(e), e
        else:
            raise AssertionError("a bad regex was accepted")

    def required_tool_choice_always_calls():
        # A question that needs no tool: with tool_choice required (or the function named) the
        # answer is still a well-formed call with schema-valid arguments.
        for seed, choice in [(1, "required"), (2, "required"),
                             (3, {"type": "function", "function": {"name": "get_weather"}})]:
            r = oc.chat.completions.create(
                model="qwen2.5-coder-0.5b", seed=seed, temperature=0.8, max_tokens=80, tools=[weather],
                tool_choice=choice, parallel_tool_calls=False,
                messages=[{"role": "user", "content": "Tell me a joke about the sea."}])
            c = r.choices[0]
            assert c.finish_reason == "tool_calls" and c.message.tool_calls, r
            call = c.message.tool_calls[0]
            args = json.loads(call.function.arguments)
            assert call.function.name == "get_weather" and isinstance(args["city"], str), r
            assert args["unit"] in ("celsius", "fahrenheit"), r

    def anthropic_tool_choice_any_calls():
        ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0)
        m = ac.messages.create(
            model="qwen2.5-coder-0.5b", max_tokens=80, extra_body={"temperature": 0.7, "seed": 5},
            tools=[{"name": "get_weather", "description": "Weather of a city.",
                    "input_schema": weather["function"]["parameters"]}],
            # One call (no parallel use): the grammar then ends the answer after it.
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": "Hi there!"}])
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather", m
        assert uses[0].input["unit"] in ("celsius", "fahrenheit"), m

    def responses_text_format_json_schema():
        r = oc.responses.create(
            model="qwen2.5-coder-0.5b", input="Name a fruit and its colour.", max_output_tokens=60, temperature=0,
            text={"format": {"type": "json_schema", "name": "fruit", "strict": True, "schema": {
                "type": "object", "properties": {"fruit": {"type": "string"}, "colour": {"type": "string"}},
                "required": ["fruit", "colour"], "additionalProperties": False}}})
        v = json.loads(r.output_text)
        assert set(v) == {"fruit", "colour"}, r.output_text

    return [openai_agents_two_tool_task, structured_output_parses_into_the_schema, required_tool_choice_always_calls,
            anthropic_tool_choice_any_calls, responses_text_format_json_schema]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--script", required=True)
    ap.add_argument("--agent-model", required=True, help="qwen2.5-coder-0.5b's GGUF (make models)")
    a = ap.parse_args()
    passed, failed = 0, 0
    servers = []
    try:
        real = Served([a.bin, "serve", "-m", a.fixture, "--model-id", "tiny-qwen2", "-t", "2"])
        servers.append(real)
        scripted = Served([a.bin, "serve", "--test-script", a.script, "--api-key", KEY])
        servers.append(scripted)
        agent = Served([a.bin, "serve", "-m", a.agent_model, "--model-id", "qwen2.5-coder-0.5b", "-t", "2"])
        servers.append(agent)
        for test in real_engine_tests(real.port) + scripted_tests(scripted.port) + agent_tests(agent.port):
            try:
                test()
                passed += 1
                print(f"sdk {test.__name__} ... ok", flush=True)
            except Exception:
                failed += 1
                print(f"sdk {test.__name__} ... FAILED", flush=True)
                traceback.print_exc()
    finally:
        for s in servers:
            s.stop()
    print(f"sdk: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
