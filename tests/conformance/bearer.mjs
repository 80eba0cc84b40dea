// Loaded into the conformance suite's process (node --import): every request it sends to the server under test
// carries `Authorization: Bearer $CONFORMANCE_BEARER_TOKEN`. The suite has no option for a header of its own
// (modelcontextprotocol/conformance#453; this file goes once it has one), and none of its server scenarios tests
// authorization, so the header changes nothing a scenario checks. The token travels in the environment, not in argv.
//
// The suite sends through three clients: fetch (the SDK's transport) and undici's request, both through undici's
// global dispatcher, which an interceptor wraps here; and node:http's request (the SEP-2243 header scenarios).
import http from "node:http";
import { Agent, setGlobalDispatcher } from "undici";

const token = process.env.CONFORMANCE_BEARER_TOKEN;
const server = new URL(process.env.CONFORMANCE_SERVER_URL);
if (!token) throw new Error("bearer.mjs needs CONFORMANCE_BEARER_TOKEN");

const AUTHORIZATION = `Bearer ${token}`;
const defaultPort = (url) => url.port || (url.protocol === "https:" ? "443" : "80");

function isServer(origin) {
  const url = new URL(origin);
  return url.hostname === server.hostname && defaultPort(url) === defaultPort(server);
}

// undici takes headers as a record, a flat [name, value, ...] array or an iterable of [name, value] pairs.
function withAuthorization(headers) {
  if (headers == null) return { authorization: AUTHORIZATION };
  if (Array.isArray(headers) && (headers.length === 0 || typeof headers[0] === "string")) {
    const named = headers.some((value, i) => i % 2 === 0 && value.toLowerCase() === "authorization");
    return named ? headers : [...headers, "authorization", AUTHORIZATION];
  }
  const pairs = typeof headers[Symbol.iterator] === "function" ? [...headers] : Object.entries(headers);
  if (pairs.some(([name]) => name.toLowerCase() === "authorization")) return headers;
  return [...pairs.flat(), "authorization", AUTHORIZATION];
}

setGlobalDispatcher(
  new Agent().compose(
    (dispatch) => (options, handler) =>
      dispatch(
        isServer(options.origin) ? { ...options, headers: withAuthorization(options.headers) } : options,
        handler,
      ),
  ),
);

const request = http.request;
http.request = function requestWithAuthorization(...args) {
  const sent = request.apply(this, args);
  const host = sent.getHeader("host") ?? sent.host;
  if (isServer(`http://${host}`) && !sent.hasHeader("authorization")) sent.setHeader("Authorization", AUTHORIZATION);
  return sent;
};
