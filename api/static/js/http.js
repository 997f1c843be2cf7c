// The page's calls to the API: the key the user typed (kept in this browser's localStorage) goes
// out only as an Authorization header to this origin.
export const KEY_STORE = "mlxq.apiKey";

export function headers(json) {
  const h = {};
  const key = localStorage.getItem(KEY_STORE);
  if (key) h.Authorization = `Bearer ${key}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error && body.error.message ? body.error.message : `HTTP ${response.status}`;
  } catch (err) {
    return `HTTP ${response.status}`;
  }
}

// GET or POST a JSON resource; an error answer throws with the API's own message.
export async function call(path, method = "GET") {
  let response;
  try {
    response = await fetch(path, { method, headers: headers(false) });
  } catch (err) {
    throw new Error(`cannot reach the API: ${err.message}`);
  }
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.json();
}
