// Small helpers to put the API's data into the page, always as text (textContent), never HTML.
export const $ = (id) => document.getElementById(id);

export function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// `table`: a table element, or its id.
export function fill(table, rows, addRow) {
  const body = (typeof table === "string" ? $(table) : table).tBodies[0];
  body.replaceChildren();
  for (const item of rows) addRow(body.insertRow(), item);
}

export function seconds(value) {
  return value === null || value === undefined ? "-" : `${value.toFixed(2)}s`;
}

// How long before `now` a unix time (s) was, both from the same clock (the fleet's snapshot).
export function ago(now, unix) {
  return unix === null || unix === undefined ? "-" : `${Math.max(0, now - unix).toFixed(1)}s ago`;
}

// A unix time (s) as the local time of day, with the date when it is not today.
export function clock(unix) {
  if (unix === null || unix === undefined) return "-";
  const at = new Date(unix * 1000);
  const time = at.toLocaleTimeString([], { hour12: false });
  return at.toDateString() === new Date().toDateString() ? time : `${at.toLocaleDateString()} ${time}`;
}

export function button(text, onClick, className) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  if (className) b.className = className;
  b.addEventListener("click", onClick);
  return b;
}
