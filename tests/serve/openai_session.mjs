// A session with OpenAI's own client library (npm `openai`) against `deepinfer serve`: models,
// completions, chat, streaming with usage, the error shapes it maps to exceptions. Run by
// scripts/stages/openai-client.sh with BASE_URL, API_KEY and EXPECTED (the greedy completion text
// `deepinfer generate` printed for PROMPT).
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
let passed = 0, failed = 0;
function check(name, ok, detail) {
  console.log(`${ok ? "PASS" : "FAIL"} ${name}${detail ? "  " + detail : ""}`);
  ok ? passed++ : failed++;
}

const models = await client.models.list();
check("models.list names the served model", models.data.length === 1 && models.data[0].id === "tiny",
      models.data.map((m) => m.id).join(","));

const c = await client.completions.create(
    { model: "tiny", prompt: process.env.PROMPT, max_tokens: 24, temperature: 0 });
check("greedy completion equals generate", c.choices[0].text === process.env.EXPECTED,
      JSON.stringify(c.choices[0].text));
check("usage counts the tokens", c.usage.completion_tokens === 24 && c.usage.total_tokens ===
      c.usage.prompt_tokens + 24, JSON.stringify(c.usage));

const chat = await client.chat.completions.create(
    { model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 12, temperature: 0 });
check("chat returns an assistant message", chat.choices[0].message.role === "assistant" &&
      chat.choices[0].message.content.length > 0, JSON.stringify(chat.choices[0].message));

const stream = await client.chat.completions.create({
  model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 12, temperature: 0,
  stream: true, stream_options: { include_usage: true } });
let text = "", usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.choices.length) {
    text += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
check("streamed chat equals the non-streamed answer", text === chat.choices[0].message.content,
      JSON.stringify(text));
check("stream ends with finish_reason and usage", finish === "length" && usage?.completion_tokens === 12,
      `${finish} ${JSON.stringify(usage)}`);

try {
  await new OpenAI({ baseURL: process.env.BASE_URL, apiKey: "wrong" }).models.list();
  check("a wrong key is refused", false, "no error");
} catch (e) {
  check("a wrong key is AuthenticationError 401", e instanceof OpenAI.AuthenticationError && e.status === 401);
}
try {
  await client.completions.create({ model: "tiny", prompt: "x", max_tokens: 0 });
  check("max_tokens 0 is refused", false, "no error");
} catch (e) {
  check("max_tokens 0 is BadRequestError 400 naming the field",
        e instanceof OpenAI.BadRequestError && e.error?.param === "max_tokens", e.message);
}
try {
  await client.completions.create({ model: "nope", prompt: "x" });
  check("an unknown model is refused", false, "no error");
} catch (e) {
  check("an unknown model is NotFoundError 404", e instanceof OpenAI.NotFoundError, e.message);
}
console.log(`openai-client: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
