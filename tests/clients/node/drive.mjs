// Drives a running service with the Node clients people already use, unchanged: the official
// `deepl-node` library and the `translate` package (its `deepl` and `libre` engines).
// Usage: node drive.mjs SERVICE_URL GOOD_KEY
// Prints one JSON object: what each call returned, or the error it raised.
import * as deepl from "deepl-node";
import { Translate } from "translate";

const [serviceUrl, goodKey] = process.argv.slice(2);

// `translate`'s deepl engine always calls api.deepl.com (or api-free. for ":fx" keys): its
// requests are sent unchanged, to this service instead.
const realFetch = globalThis.fetch;
globalThis.fetch = (url, init) =>
  realFetch(String(url).replace(/^https:\/\/api(-free)?\.deepl\.com/, serviceUrl), init);

async function attempt(call) {
  try {
    return { ok: await call() };
  } catch (error) {
    return { error: error.constructor.name, message: String(error.message) };
  }
}

const translator = new deepl.Translator(goodKey, { serverUrl: serviceUrl, maxRetries: 0 });
const wrongKey = new deepl.Translator("wrong-key", { serverUrl: serviceUrl, maxRetries: 0 });
const report = {
  deeplText: await attempt(async () => {
    const result = await translator.translateText("Guten Morgen, wie geht es dir?", null, "en-US");
    return { text: typeof result.text, detected: result.detectedSourceLang };
  }),
  deeplBatch: await attempt(async () => {
    const results = await translator.translateText(["Hello", "Bonjour tout le monde"], null, "zh-HANS");
    return results.map((r) => r.detectedSourceLang);
  }),
  deeplHtml: await attempt(async () => {
    const result = await translator.translateText("<p>Hello <code>x = 1</code></p>", "en", "de", {
      tagHandling: "html",
      ignoreTags: ["code"],
    });
    return result.text;
  }),
  deeplTargets: await attempt(async () =>
    (await translator.getTargetLanguages()).map((language) => language.code),
  ),
  deeplUsage: await attempt(async () => {
    const usage = await translator.getUsage();
    return { count: usage.character?.count ?? null, limit: usage.character?.limit ?? null };
  }),
  deeplFormality: await attempt(async () =>
    (await translator.translateText("Hello", "en", "de", { formality: "prefer_more" })).text.length >= 0,
  ),
  deeplWrongKey: await attempt(async () => (await wrongKey.translateText("Hi", null, "de")).text),
  translateDeepl: await attempt(() =>
    Translate({ engine: "deepl", key: goodKey, from: "en", to: "de" })("Good morning"),
  ),
  translateDeeplWrongKey: await attempt(() =>
    // A text of its own: the package caches answers by text and languages, whatever the key.
    Translate({ engine: "deepl", key: "wrong-key", from: "en", to: "de" })("Good evening"),
  ),
  translateLibre: await attempt(() =>
    Translate({ engine: "libre", key: goodKey, url: `${serviceUrl}/libretranslate/translate` })(
      "Good morning",
      { from: "en", to: "pb" },
    ),
  ),
};
console.log(JSON.stringify(report));
