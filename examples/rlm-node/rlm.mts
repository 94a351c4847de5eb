/**
 * A small recursive-language-model (RLM) loop in Node.js on pyvisor.
 *
 * The context (stdin) lives in a pyvisor session as the variable `context`, never in the
 * model's prompt. The model explores it by writing Python, which runs in the session; the
 * code's `llm_query` / `llm_query_batched` calls come back to this program through the
 * client-answered bridge (`llm: "client"`), which asks the same endpoint. The model ends
 * with `FINAL(answer)` or `FINAL_VAR(name)`.
 *
 *     OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=... OPENAI_MODEL=gpt-4o-mini \
 *       node examples/rlm-node/rlm.mjs "What does this log say went wrong?" < app.log
 *
 * Any OpenAI-compatible endpoint works (vLLM, llama.cpp's server, Ollama's /v1). pyvisor is
 * found as every client finds it: a daemon on `$PYVISOR_SOCKET` or the default socket, else
 * a child `pyvisor serve --stdio` (`$PYVISOR_BIN`, else `pyvisor` on PATH).
 */

import { readFileSync } from "node:fs";

import { PyvisorSandbox, type LlmCall } from "../../clients/typescript/dist/index.js";

const BASE_URL = (process.env.OPENAI_BASE_URL ?? "https://api.openai.com/v1").replace(/\/+$/, "");
const API_KEY = process.env.OPENAI_API_KEY ?? "";
const MODEL = process.env.OPENAI_MODEL ?? "gpt-4o-mini";
const MAX_ITERATIONS = Number(process.env.RLM_MAX_ITERATIONS ?? 10);
/** The most characters of one block's output fed back to the model. */
const OUTPUT_CHARS = 4000;

interface Message {
  role: "system" | "user" | "assistant";
  content: string;
}

const totals = { calls: 0, subCalls: 0, inputTokens: 0, outputTokens: 0 };

/** One chat completion: its text and the tokens it used. */
async function chat(messages: Message[]): Promise<{ text: string; input: number; output: number }> {
  const response = await fetch(`${BASE_URL}/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...(API_KEY ? { Authorization: `Bearer ${API_KEY}` } : {}) },
    body: JSON.stringify({ model: MODEL, messages }),
  });
  if (!response.ok) throw new Error(`the endpoint answered ${response.status}: ${(await response.text()).slice(0, 300)}`);
  const body = (await response.json()) as {
    choices: { message: { content: string } }[];
    usage?: { prompt_tokens?: number; completion_tokens?: number };
  };
  const input = body.usage?.prompt_tokens ?? 0;
  const output = body.usage?.completion_tokens ?? 0;
  totals.calls += 1;
  totals.inputTokens += input;
  totals.outputTokens += output;
  return { text: body.choices[0]?.message.content ?? "", input, output };
}

/** Answers the session code's llm_query calls: each prompt its own completion, at once. */
async function onLlm(call: LlmCall) {
  totals.subCalls += call.prompts.length;
  const done = await Promise.all(call.prompts.map((prompt) => chat([{ role: "user", content: prompt }])));
  return {
    answers: done.map((d) => d.text),
    usage: { input_tokens: done.reduce((n, d) => n + d.input, 0), output_tokens: done.reduce((n, d) => n + d.output, 0) },
  };
}

function systemPrompt(contextChars: number): string {
  return [
    "You answer a question about a context you cannot see directly. It is in a persistent Python",
    `session as the variable \`context\` (a string of ${contextChars} characters).`,
    "Write Python in ```repl blocks to look at it; you will see what each block prints.",
    "In that code, llm_query(prompt) asks a language model and returns its answer (a string), and",
    "llm_query_batched(prompts) asks several at once; use them on chunks of the context.",
    "Variables persist between blocks. When you know the answer, reply FINAL(your answer), or",
    "FINAL_VAR(name) to answer with the value of a variable.",
  ].join("\n");
}

/** The code blocks of a reply. */
function codeBlocks(reply: string): string[] {
  return [...reply.matchAll(/```(?:repl|python)?\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

async function main(): Promise<void> {
  const question = process.argv[2];
  if (!question) throw new Error('usage: node rlm.mjs "question" < context.txt');
  const context = readFileSync(0, "utf8");
  const sandbox = await PyvisorSandbox.create({ session: { llm: "client" }, run: { onLlm } });
  try {
    await sandbox.setVariable("context", context);
    const messages: Message[] = [
      { role: "system", content: systemPrompt(context.length) },
      { role: "user", content: question },
    ];
    for (let iteration = 1; iteration <= MAX_ITERATIONS; iteration++) {
      const reply = (await chat(messages)).text;
      messages.push({ role: "assistant", content: reply });
      const finalVar = /FINAL_VAR\((\w+)\)/.exec(reply);
      const final = /FINAL\(([\s\S]*)\)\s*$/.exec(reply);
      if (finalVar || (final && codeBlocks(reply).length === 0)) {
        const answer = finalVar ? await sandbox.getVariable(finalVar[1]!) : final![1]!;
        console.log(typeof answer === "string" ? answer : JSON.stringify(answer));
        console.error(
          `[${iteration} iteration(s), ${totals.calls} completion(s) of which ${totals.subCalls} from the session, ` +
            `${totals.inputTokens} input and ${totals.outputTokens} output tokens]`,
        );
        return;
      }
      const blocks = codeBlocks(reply);
      if (blocks.length === 0) {
        messages.push({ role: "user", content: "Write code in a ```repl block, or answer with FINAL(...)." });
        continue;
      }
      for (const code of blocks) {
        const ran = await sandbox.execute(code);
        let shown = ran.stdout + ran.stderr + (ran.result !== undefined ? ran.result + "\n" : "") + (ran.error ?? "");
        if (shown.length > OUTPUT_CHARS) shown = shown.slice(0, OUTPUT_CHARS) + `\n[output truncated: ${shown.length} characters]`;
        messages.push({ role: "user", content: `Output:\n${shown || "(nothing)"}` });
      }
    }
    throw new Error(`no FINAL answer within ${MAX_ITERATIONS} iterations`);
  } finally {
    await sandbox.dispose();
  }
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
