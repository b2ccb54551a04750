"""Writes src/tandem/bench/workloads/long_output.jsonl: prompts whose answers run 200-500 tokens
and repeat much of their input or of earlier turns (code edits that return the whole file,
reformatting, extraction, agent-style loops). Run it again after editing the sources below."""

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src/tandem/bench/workloads/long_output.jsonl"

INVENTORY = '''from dataclasses import dataclass, field


@dataclass
class Item:
    sku: str
    name: str
    quantity: int
    unit_price: float


@dataclass
class Inventory:
    items: dict[str, Item] = field(default_factory=dict)

    def add(self, item: Item) -> None:
        if item.sku in self.items:
            self.items[item.sku].quantity += item.quantity
        else:
            self.items[item.sku] = item

    def remove(self, sku: str, quantity: int) -> None:
        item = self.items[sku]
        item.quantity -= quantity
        if item.quantity <= 0:
            del self.items[sku]

    def total_value(self) -> float:
        return sum(i.quantity * i.unit_price for i in self.items.values())

    def low_stock(self, threshold: int) -> list[Item]:
        return [i for i in self.items.values() if i.quantity < threshold]
'''

PARSER = '''import sys


def parse_line(line):
    parts = line.strip().split(",")
    if len(parts) != 3:
        return None
    name, age, city = parts
    return {"name": name, "age": int(age), "city": city}


def load(path):
    people = []
    with open(path) as f:
        for line in f:
            person = parse_line(line)
            if person is not None:
                people.append(person)
    return people


def by_city(people):
    groups = {}
    for person in people:
        groups.setdefault(person["city"], []).append(person)
    return groups


def main():
    people = load(sys.argv[1])
    for city, group in sorted(by_city(people).items()):
        ages = [p["age"] for p in group]
        print(city, len(group), sum(ages) / len(ages))


if __name__ == "__main__":
    main()
'''

SERVER_JS = '''const express = require("express");
const app = express();
app.use(express.json());

let todos = [];
let nextId = 1;

app.get("/todos", (req, res) => {
  res.json(todos);
});

app.post("/todos", (req, res) => {
  const todo = { id: nextId++, title: req.body.title, done: false };
  todos.push(todo);
  res.status(201).json(todo);
});

app.put("/todos/:id", (req, res) => {
  const todo = todos.find((t) => t.id === Number(req.params.id));
  if (!todo) {
    return res.status(404).json({ error: "not found" });
  }
  todo.title = req.body.title ?? todo.title;
  todo.done = req.body.done ?? todo.done;
  res.json(todo);
});

app.delete("/todos/:id", (req, res) => {
  todos = todos.filter((t) => t.id !== Number(req.params.id));
  res.status(204).end();
});

app.listen(3000, () => console.log("listening on 3000"));
'''

CONFIG_JSON = json.dumps({
    "service": "billing", "version": "2.4.1", "port": 8080,
    "database": {"host": "db.internal", "port": 5432, "name": "billing", "pool": {"min": 2, "max": 20}},
    "queues": [{"name": "invoices", "workers": 4, "retry": 3}, {"name": "refunds", "workers": 2, "retry": 5},
               {"name": "reports", "workers": 1, "retry": 1}],
    "features": {"new_checkout": True, "tax_v2": False, "email_receipts": True},
    "logging": {"level": "info", "format": "json", "sinks": ["stdout", "file:/var/log/billing.log"]},
}, indent=2)

MEETING = '''Attendees: Priya Raman (product), Tom Becker (backend), Ana Souza (design), Li Wei (QA).
Priya opened by saying the March release slips one week to March 21 because the payment provider
changed its API. Tom will port the checkout service to the new API by March 12 and write a
migration note for support. Ana showed the new onboarding screens; the team agreed to drop the
third screen and move its content into a tooltip. Ana will send the final designs by March 8.
Li reported 14 open bugs, 3 of them blocking: the refund total is wrong when a coupon is applied,
the invoice PDF cuts the last line, and the mobile menu does not close after navigation. Tom takes
the refund bug, Ana the mobile menu, and Li will retest the PDF fix already merged by Tom on
Tuesday. Priya asked everyone to update the tracker by Friday. Next meeting: March 10 at 10:00.'''

LOG = '''2024-03-02 10:00:01 INFO  api     request id=a1 path=/orders status=200 ms=35
2024-03-02 10:00:02 INFO  api     request id=a2 path=/orders/17 status=200 ms=21
2024-03-02 10:00:02 WARN  db      slow query ms=812 table=orders
2024-03-02 10:00:03 INFO  api     request id=a3 path=/cart status=200 ms=44
2024-03-02 10:00:05 ERROR api     request id=a4 path=/checkout status=500 ms=1203 error=timeout
2024-03-02 10:00:06 INFO  api     request id=a5 path=/orders status=200 ms=29
2024-03-02 10:00:07 ERROR payment provider=stripe code=card_declined order=881
2024-03-02 10:00:09 INFO  api     request id=a6 path=/cart status=200 ms=38
2024-03-02 10:00:11 WARN  db      slow query ms=934 table=invoices
2024-03-02 10:00:12 ERROR api     request id=a7 path=/checkout status=500 ms=1187 error=timeout
2024-03-02 10:00:13 INFO  api     request id=a8 path=/orders/18 status=404 ms=12'''


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def fenced(language, code):
    return f"```{language}\n{code}```"


PROMPTS = [
    ("edit-inventory-docstrings", "code_edit", [user(
        "Add a one-line docstring to every class and method in this file and return the whole file, "
        "changed, in one code block:\n\n" + fenced("python", INVENTORY))]),
    ("edit-inventory-errors", "code_edit", [user(
        "Make `remove` raise a KeyError with a clear message when the SKU is unknown and a ValueError when "
        "quantity is not positive. Return the complete updated file.\n\n" + fenced("python", INVENTORY))]),
    ("edit-parser-types", "code_edit", [user(
        "Add type hints to every function in this script (use TypedDict for a person) and return the whole "
        "script:\n\n" + fenced("python", PARSER))]),
    ("edit-parser-pathlib", "code_edit", [user(
        "Rewrite this script to use pathlib and the csv module instead of splitting lines by hand. Keep the "
        "behaviour and the function names, and return the entire file.\n\n" + fenced("python", PARSER))]),
    ("edit-js-validation", "code_edit", [user(
        "Add validation to this Express app: POST and PUT must reject a missing or empty title with a 400 and "
        "a JSON error. Return the whole file with the change.\n\n" + fenced("javascript", SERVER_JS))]),
    ("edit-js-async", "code_edit", [user(
        "Rename `todos` to `items` and `nextId` to `nextItemId` everywhere in this file, and change the port "
        "to come from process.env.PORT (default 3000). Return the full file.\n\n" + fenced("javascript", SERVER_JS))]),
    ("reformat-config-yaml", "reformat", [user(
        "Convert this JSON configuration to YAML, keeping every key and value and the order:\n\n"
        + fenced("json", CONFIG_JSON + "\n"))]),
    ("reformat-config-env", "reformat", [user(
        "Flatten this JSON configuration into environment variables, one per line, like "
        "BILLING_DATABASE_POOL_MAX=20 (lists indexed: BILLING_QUEUES_0_NAME=invoices):\n\n"
        + fenced("json", CONFIG_JSON + "\n"))]),
    ("reformat-log-csv", "reformat", [user(
        "Turn these log lines into CSV with the header timestamp,level,component,message, one row per "
        "line, quoting the message:\n\n" + fenced("text", LOG + "\n"))]),
    ("reformat-inventory-js", "reformat", [user(
        "Translate this Python module to TypeScript classes with the same names and methods:\n\n"
        + fenced("python", INVENTORY))]),
    ("extract-meeting-actions", "extraction", [user(
        "From these meeting notes, list every action item as a JSON array of objects with owner, task and "
        "due (null if none), then list every date mentioned with what happens on it:\n\n" + MEETING)]),
    ("extract-log-errors", "extraction", [user(
        "Copy every WARN and ERROR line of this log verbatim, grouped by component, then give a table of "
        "request ids with status 500:\n\n" + fenced("text", LOG + "\n"))]),
    ("extract-js-routes", "extraction", [user(
        "For each route in this Express app, copy its handler code verbatim under a heading with the method "
        "and path:\n\n" + fenced("javascript", SERVER_JS))]),
    ("extract-inventory-api", "extraction", [user(
        "Write the API reference of this module in Markdown: for each class its fields, for each method its "
        "signature copied exactly and one sentence:\n\n" + fenced("python", INVENTORY))]),
    ("agent-repeat-with-fix", "agent_loop", [
        user("Write a Python function that reads a CSV of people (name,age,city) and prints the average age per city."),
        assistant(fenced("python", PARSER)),
        user("Running it on a file with a header row crashes: int('age') fails. Fix it to skip the header, "
             "and show the whole file again.")]),
    ("agent-second-edit", "agent_loop", [
        user("Here is my inventory module.\n\n" + fenced("python", INVENTORY)),
        assistant("Thanks, I have read it. What should I change?"),
        user("Add a method `restock(self, sku: str, quantity: int)` after `remove`, then print the whole file.")]),
    ("agent-tool-result", "agent_loop", [
        user("List the failing requests in today's log."),
        assistant("I will look at the log.\n\nTOOL CALL read_log(date='2024-03-02')"),
        user("TOOL RESULT:\n" + LOG + "\n\nNow answer: quote each failing line and explain each one."),
    ]),
    ("agent-iterate-js", "agent_loop", [
        user("Write a small Express todo API."),
        assistant(fenced("javascript", SERVER_JS)),
        user("Good. Now add a GET /todos/:id route next to the others and return the complete file again."),
    ]),
]


def main() -> None:
    lines = [json.dumps({"id": pid, "category": category, "messages": messages}, ensure_ascii=False)
             for pid, category, messages in PROMPTS]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} prompts to {OUT}")


if __name__ == "__main__":
    main()
