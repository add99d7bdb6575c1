// Reads a JSON list of PromQL expressions on stdin and prints, as JSON, one list of syntax
// errors per expression: Prometheus's own grammar (the one its UI uses) marks what it cannot
// parse, including calls to functions PromQL does not have.
const { parser } = require("@prometheus-io/lezer-promql");

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const results = JSON.parse(input).map((expr) => {
    const errors = [];
    parser.parse(expr).iterate({
      enter(node) {
        if (node.type.isError) {
          errors.push(`cannot parse at ${node.from}: ${JSON.stringify(expr.slice(node.from, node.from + 20))}`);
        }
      },
    });
    return errors;
  });
  process.stdout.write(JSON.stringify(results));
});
