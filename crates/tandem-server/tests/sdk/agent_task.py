"""An agent built with a published framework (`openai-agents`, its chat-completions model)
against `tandem serve` on a real catalogue model (qwen2.5-coder-0.5b): a two-tool task, a
lookup and then a computation on its result. The tools record their calls, so the test checks
that they were really called, with the right arguments, and that the run ends with the
computed value.

qwen2.5-coder-0.5b answers tool requests with plain JSON objects, not its template's
`<tool_call>` tags; tandem reads those as calls when they name an offered tool with fitting
arguments. Greedy decoding; one call per turn (`parallel_tool_calls=False`: the small model
otherwise guesses the second call's arguments in the same turn); the run stops at the
computation's result (`StopAtTools`), since the model would keep calling tools.
"""

import asyncio

from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, StopAtTools, function_tool,
                    set_tracing_disabled)
from openai import AsyncOpenAI

POPULATION = {"paris": 2102650}


def run_two_tool_task(port, model_id):
    set_tracing_disabled(True)
    calls = []

    @function_tool
    def city_population(city: str) -> int:
        """Return the population of a city."""
        calls.append(("city_population", city))
        return POPULATION.get(city.lower(), 1000)

    @function_tool
    def multiply(a: float, b: float) -> float:
        """Multiply two numbers."""
        calls.append(("multiply", a, b))
        return a * b

    async def go():
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        agent = Agent(
            name="helper",
            instructions="You are a helpful assistant. Use the tools.",
            model=OpenAIChatCompletionsModel(model=model_id, openai_client=client),
            tools=[city_population, multiply],
            model_settings=ModelSettings(temperature=0, parallel_tool_calls=False),
            tool_use_behavior=StopAtTools(stop_at_tool_names=["multiply"]),
        )
        result = await Runner.run(
            agent, "What is the population of Paris? Then multiply it by 3 with the multiply tool.", max_turns=6)
        return result.final_output

    final = asyncio.run(go())
    lookups = [c for c in calls if c[0] == "city_population"]
    products = [c for c in calls if c[0] == "multiply"]
    assert calls and calls[0][0] == "city_population", calls
    assert lookups and all(c[1].lower() == "paris" for c in lookups), calls
    assert products == [("multiply", 2102650.0, 3.0)], calls
    assert float(final) == 6307950.0, (final, calls)
    return calls
