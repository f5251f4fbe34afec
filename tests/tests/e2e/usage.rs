//! End-to-end: what runs spend and what they may spend (`protocol::usage`), through the real
//! binaries. acp-child on the mock model reports the mock's scripted figures (the prompt
//! response's `usage`, a `usage_update` after each reply); acp-host records them in the result,
//! sums a delegating parent's tree, and holds `--token-budget` / `--cost-budget` (exit 7, nothing
//! left running). An agent that reports nothing gets `usage: null` and, with a budget, a warning.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use acp_tests::mock_llm::{MockLlm, Reply, Usage};
use acp_tests::{host_run, run_to_end, stderr};
use serde_json::{Value, json};

use super::children::{
    assert_none_left, await_task, delegate, delegate_in_background, kept, write_approved,
};
use super::common::{MODEL_ENV, acp_child_json_run, json_run, mock, temp};

/// A reply reading `notes.txt` (a tool call, so the turn makes another request).
fn read_notes(id: &str) -> Reply {
    Reply::tool_call(id, "read_file", &json!({"path": "notes.txt"}), 1)
}

/// The `usage_update`s of our session among `records`, in order.
fn usage_updates(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["type"] == "update" && r.get("sessionId").is_none_or(Value::is_null))
        .map(|r| &r["update"])
        .filter(|u| u["sessionUpdate"] == "usage_update")
        .collect()
}

#[test]
fn a_runs_usage_is_the_sum_of_what_the_model_server_reported() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    let llm = MockLlm::builder()
        .reply_with_usage(
            read_notes("call_1"),
            Usage {
                cached_tokens: Some(40),
                ..Usage::new(100, 20)
            },
        )
        .reply_with_usage(
            Reply::text(["done"]),
            Usage {
                reasoning_tokens: Some(7),
                ..Usage::new(150, 30)
            },
        )
        .start();
    let (records, result) = json_run(
        acp_child_json_run(dir.path(), &llm, &["--context-window", "1000"]).arg("read the notes"),
        0,
    );
    assert_eq!(
        result["usage"],
        json!({"inputTokens": 250, "outputTokens": 50, "totalTokens": 300,
            "thoughtTokens": 7, "cachedReadTokens": 40}),
        "{result}"
    );
    assert!(result.get("warnings").is_none(), "{result}");
    // Every request asked for usage.
    for request in llm.requests() {
        assert_eq!(
            request.body["stream_options"],
            json!({"include_usage": true})
        );
    }
    // A usage_update after each reply: the context the request carried, the window, and the
    // session's cumulative counts in the `acp-host/usage` extension.
    let updates = usage_updates(&records);
    assert_eq!(updates.len(), 2, "{records:#?}");
    assert_eq!(updates[0]["used"], 100);
    assert_eq!(updates[0]["size"], 1000);
    assert_eq!(updates[0]["_meta"]["acp-host/usage"]["totalTokens"], 120);
    assert_eq!(updates[1]["used"], 150);
    assert_eq!(
        updates[1]["_meta"]["acp-host/usage"],
        json!({"version": 1, "inputTokens": 250, "outputTokens": 50, "totalTokens": 300,
            "thoughtTokens": 7, "cachedReadTokens": 40})
    );
    assert!(updates[1].get("cost").is_none(), "no prices, no cost");
    assert_none_left(dir.path());
}

#[test]
fn the_window_comes_from_the_server_listing_and_verbose_shows_the_usage_line() {
    let dir = temp();
    let llm = MockLlm::builder()
        .models(["mock-model"])
        .context_window(64_000)
        .reply_with_usage(Reply::text(["hi"]), Usage::new(1_200, 34))
        .reply_with_usage(Reply::text(["hi"]), Usage::new(1_200, 34))
        .start();
    let (records, _) = json_run(acp_child_json_run(dir.path(), &llm, &[]).arg("say hi"), 0);
    let updates = usage_updates(&records);
    assert_eq!(updates.len(), 1, "{records:#?}");
    assert_eq!(updates[0]["size"], 64_000);

    // Human mode: the text on stdout, one line of usage on stderr under --verbose.
    let mut cmd = host_run(dir.path());
    for name in MODEL_ENV {
        cmd.env_remove(name);
    }
    let agent = shell_words::join([
        "acp-child",
        "--model",
        "mock-model",
        "--base-url",
        &llm.base_url(),
        "--state-dir",
        &dir.path().join(".state").display().to_string(),
    ]);
    cmd.args(["--verbose", "--agent", &agent, "say hi"]);
    let out = run_to_end(&mut cmd);
    assert_eq!(acp_tests::code(&out), 0, "{}", stderr(&out));
    assert_eq!(acp_tests::stdout(&out), "hi");
    assert!(
        stderr(&out).ends_with("acp-host: usage: 1,234 tokens (1,200 in, 34 out)\n"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_agent_that_reports_nothing_has_null_usage_and_a_budget_it_cannot_be_held_to_is_an_error() {
    let dir = temp();
    let mut cmd = host_run(dir.path());
    cmd.args(["--json", "--agent", &mock(&["hello"]), "hello"]);
    let (_, result) = json_run(&mut cmd, 0);
    assert_eq!(result["usage"], Value::Null, "{result}");
    assert!(result.get("warnings").is_none(), "{result}");

    // By default a budget nothing is reported against, by the end of the first reply, is not
    // silently ignored: the run is an error of kind budget.
    for budget in [["--token-budget", "10"], ["--cost-budget", "0.5"]] {
        let mut cmd = host_run(dir.path());
        cmd.arg("--json")
            .args(budget)
            .args(["--agent", &mock(&["hello"]), "hello"]);
        let (_, result) = json_run(&mut cmd, 1);
        assert_eq!(result["status"], "error", "{result}");
        assert_eq!(result["errorKind"], "budget");
        assert_eq!(
            result["error"],
            "the agent reports no usage; the budget cannot be held"
        );
        assert_eq!(result["usage"], Value::Null);
        assert!(result.get("warnings").is_none(), "{result}");
    }
    let mut cmd = host_run(dir.path());
    cmd.args([
        "--token-budget",
        "10",
        "--agent",
        &mock(&["hello"]),
        "hello",
    ]);
    let out = run_to_end(&mut cmd);
    assert_eq!(acp_tests::code(&out), 1);
    assert_eq!(
        stderr(&out),
        "acp-host: error: the agent reports no usage; the budget cannot be held\n"
    );

    // --on-unreported warn: today's behaviour, completed with a warning.
    let mut cmd = host_run(dir.path());
    cmd.args([
        "--json",
        "--token-budget",
        "10",
        "--on-unreported",
        "warn",
        "--agent",
        &mock(&["hello"]),
        "hello",
    ]);
    let (_, result) = json_run(&mut cmd, 0);
    assert_eq!(result["status"], "completed");
    assert_eq!(result["usage"], Value::Null);
    assert_eq!(
        result["warnings"],
        json!(["the agent reported no usage, so the budget could not be held (usage is null)"])
    );
    // Human mode says it on stderr.
    let mut cmd = host_run(dir.path());
    cmd.args([
        "--token-budget",
        "10",
        "--on-unreported",
        "warn",
        "--agent",
        &mock(&["hello"]),
        "hello",
    ]);
    let out = run_to_end(&mut cmd);
    assert_eq!(acp_tests::code(&out), 0);
    assert_eq!(
        stderr(&out),
        "acp-host: warning: the agent reported no usage, so the budget could not be held (usage \
         is null)\n"
    );
}

/// A turn that spends 120 tokens on its first request, then waits for a second reply that never
/// comes: only the budget can end it.
fn hanging_after(usage: Usage) -> MockLlm {
    MockLlm::builder()
        .reply_with_usage(read_notes("call_1"), usage)
        .reply(Reply::Hang)
        .start()
}

#[test]
fn a_token_budget_smaller_than_the_turn_ends_it_over_budget_exit_7() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    // Figures past what the first request is estimated at (its body at 4 bytes a token), so
    // acp-child, holding the budget too, sends it.
    let llm = hanging_after(Usage::new(10_000, 20));
    let mut cmd = acp_child_json_run(dir.path(), &llm, &["--context-window", "100000"]);
    cmd.args(["--token-budget", "10000", "read the notes"]);
    let (_, result) = json_run(&mut cmd, 7);
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(result["errorKind"], "budget");
    assert_eq!(
        result["error"],
        "used 10,020 tokens, over the token budget of 10,000"
    );
    assert_eq!(result["usage"]["totalTokens"], 10_020);
    // Cancelled after the first reply: a second request, if it was sent, was never answered.
    assert!(llm.requests().len() <= 2);
    assert_none_left(dir.path());
}

#[test]
fn a_priced_acp_child_reports_its_cost_and_a_cost_budget_holds() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    // 2 per million input tokens, 8 per million output: 100 in and 20 out cost 0.00036.
    let prices = [
        "--context-window",
        "1000",
        "--price-input",
        "2",
        "--price-output",
        "8",
        "--price-currency",
        "EUR",
    ];
    let llm = MockLlm::builder()
        .reply_with_usage(read_notes("call_1"), Usage::new(100, 20))
        .reply_with_usage(Reply::text(["done"]), Usage::new(200, 10))
        .start();
    let (records, result) = json_run(
        acp_child_json_run(dir.path(), &llm, &prices).arg("read the notes"),
        0,
    );
    // 0.00036 + (200 * 2 + 10 * 8) / 1e6 = 0.00084.
    let cost = &result["usage"]["cost"];
    assert_eq!(cost["currency"], "EUR", "{result}");
    assert!(
        (cost["amount"].as_f64().unwrap() - 0.000_84).abs() < 1e-12,
        "{cost}"
    );
    let updates = usage_updates(&records);
    assert!(
        (updates[0]["cost"]["amount"].as_f64().unwrap() - 0.000_36).abs() < 1e-12,
        "the update carries the session's cumulative cost: {}",
        updates[0]
    );

    // 10,000 in and 20 out: 0.02016 EUR.
    let llm = hanging_after(Usage::new(10_000, 20));
    let mut cmd = acp_child_json_run(dir.path(), &llm, &prices);
    cmd.args(["--cost-budget", "0.02", "read the notes"]);
    let (_, result) = json_run(&mut cmd, 7);
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(result["errorKind"], "budget");
    assert_eq!(
        result["error"],
        "spent 0.0202 EUR, over the cost budget of 0.0200 EUR"
    );
    assert_none_left(dir.path());
}

/// `acp-host run --json` of a parent acp-child on `parent` (flags), delegating to acp-child
/// children on `children` (their model settings in the environment), with `extra` parent flags.
fn tree_run(dir: &Path, parent: &MockLlm, children: &MockLlm, extra: &[&str]) -> Command {
    let mut cmd = host_run(dir);
    for name in MODEL_ENV {
        cmd.env_remove(name);
    }
    let state = dir.join(".state").display().to_string();
    let base_url = parent.base_url();
    let mut words = vec![
        "acp-child",
        "--model",
        "mock-model",
        "--base-url",
        base_url.as_str(),
        "--state-dir",
        state.as_str(),
        "--context-window",
        "100000",
        "--subagent-agents",
        "acp-child",
        "--child-idle-timeout",
        "0",
    ];
    words.extend_from_slice(extra);
    cmd.args(["--json", "--agent", &shell_words::join(words)])
        .args(["--env", "ACP_CHILD_MODEL=mock-model"])
        .args([
            "--env",
            &format!("ACP_CHILD_BASE_URL={}", children.base_url()),
        ])
        .args(["--env", &format!("ACP_CHILD_STATE_DIR={state}")]);
    cmd
}

#[test]
fn a_parent_that_delegates_to_two_children_reports_all_three_and_each_childs_share() {
    let dir = temp();
    let parent = MockLlm::builder()
        .reply_with_usage(delegate("call_a", "acp-child", "task a"), Usage::new(10, 1))
        .reply_with_usage(delegate("call_b", "acp-child", "task b"), Usage::new(20, 2))
        .reply_with_usage(Reply::text(["both done"]), Usage::new(30, 3))
        .start();
    let children = MockLlm::builder()
        .reply_with_usage(Reply::text(["a done"]), Usage::new(100, 5))
        .reply_with_usage(Reply::text(["b done"]), Usage::new(200, 7))
        .start();
    let (_, result) = json_run(
        tree_run(dir.path(), &parent, &children, &[]).arg("delegate twice"),
        0,
    );
    assert_eq!(result["output"], "both done");
    // 66 of the parent's own, 105 and 207 of its children.
    assert_eq!(
        result["usage"],
        json!({"inputTokens": 360, "outputTokens": 18, "totalTokens": 378}),
        "{result}"
    );
    let shares: Vec<(&str, &Value)> = result["children"]
        .as_array()
        .expect("the children are listed")
        .iter()
        .map(|child| (child["task"].as_str().unwrap_or_default(), &child["usage"]))
        .collect();
    assert_eq!(
        shares,
        [
            (
                "task a",
                &json!({"inputTokens": 100, "outputTokens": 5, "totalTokens": 105})
            ),
            (
                "task b",
                &json!({"inputTokens": 200, "outputTokens": 7, "totalTokens": 207})
            ),
        ],
        "{result}"
    );
    // The model is told what each child spent, in one line of the call's result.
    let requests = parent.requests();
    assert_eq!(requests.len(), 3);
    let told = requests[1].tool_result("call_a").unwrap();
    assert!(
        told.ends_with(&format!(
            "{}\n\n[the subagent spent 105 tokens (100 in, 5 out)]",
            kept("a done", "agent-1")
        )),
        "{told:?}"
    );
    assert_none_left(dir.path());
}

#[test]
fn a_child_over_its_budget_is_a_tool_result_and_the_parent_goes_on() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    let parent = MockLlm::builder()
        .reply_with_usage(delegate("call_a", "acp-child", "read"), Usage::new(10, 1))
        .reply_with_usage(Reply::text(["went on"]), Usage::new(20, 2))
        .start();
    // The child spends 10,060 on its first request, then would wait for ever.
    let children = MockLlm::builder()
        .models(["mock-model"])
        .context_window(100_000)
        .reply_with_usage(read_notes("child_1"), Usage::new(10_000, 60))
        .reply(Reply::Hang)
        .start();
    let (_, result) = json_run(
        tree_run(
            dir.path(),
            &parent,
            &children,
            &["--subagent-token-budget", "10000"],
        )
        .arg("delegate"),
        0,
    );
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "went on");
    let told = parent.requests()[1].tool_result("call_a").unwrap();
    assert!(
        told.starts_with("subagent acp-child ended over-budget (10060 tokens, budget 10000)"),
        "{told:?}"
    );
    assert!(
        told.ends_with("[the subagent spent 10,060 tokens (10,000 in, 60 out)]"),
        "{told:?}"
    );
    // The child's spending is the parent's too.
    assert_eq!(result["usage"]["totalTokens"], 10_093, "{result}");
    assert_eq!(result["children"][0]["state"], "failed");
    assert_none_left(dir.path());
}

#[test]
fn a_definitions_token_budget_only_lowers_the_parents() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    write_approved(
        &dir.path().join("subagents"),
        "reader.md",
        "---\ndescription: reads\nrun:\n  tokenBudget: 5000\n---\nRead.\n",
    );
    let parent = MockLlm::builder()
        .reply_with_usage(delegate("call_a", "reader", "read"), Usage::new(10, 1))
        .reply_with_usage(Reply::text(["went on"]), Usage::new(20, 2))
        .start();
    let children = MockLlm::builder()
        .models(["mock-model"])
        .context_window(100_000)
        .reply_with_usage(read_notes("child_1"), Usage::new(5_000, 10))
        .reply(Reply::Hang)
        .start();
    // The parent's own limit (100,000) is higher: the definition's 5,000 holds.
    let (_, result) = json_run(
        tree_run(
            dir.path(),
            &parent,
            &children,
            &["--subagent-token-budget", "100000"],
        )
        .arg("delegate"),
        0,
    );
    let told = parent.requests()[1].tool_result("call_a").unwrap();
    assert!(
        told.starts_with("subagent reader ended over-budget (5010 tokens, budget 5000)"),
        "{told:?} {result}"
    );
    assert_eq!(result["status"], "completed", "{result}");
    assert_none_left(dir.path());
}

#[test]
fn batch_records_carry_usage_a_line_holds_its_budget_and_the_summaries_total_it() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    // One run at a time, so the lines take the script in order: 15 tokens, then a line whose
    // first request spends 10,020 of its 10,000.
    let llm = MockLlm::builder()
        .reply_with_usage(Reply::text(["first"]), Usage::new(10, 5))
        .reply_with_usage(read_notes("call_1"), Usage::new(10_000, 20))
        .reply(Reply::Hang)
        .start();
    let state = dir.path().join(".state").display().to_string();
    let agent = shell_words::join([
        "acp-child",
        "--model",
        "mock-model",
        "--base-url",
        &llm.base_url(),
        "--state-dir",
        &state,
        "--context-window",
        "100000",
    ]);
    std::fs::write(
        dir.path().join("jobs.ndjson"),
        "{\"id\": \"a\", \"prompt\": \"one\"}\n{\"id\": \"b\", \"prompt\": \"two\", \"tokenBudget\": 10000}\n",
    )
    .unwrap();
    let mut cmd = Command::new(acp_tests::bin("acp-host"));
    cmd.current_dir(dir.path())
        .env(protocol::env_vars::XDG_STATE_HOME, acp_tests::suite_state())
        .env_remove("ACP_HOST_LOG")
        .env_remove(protocol::env_vars::ACP_HOST_DEPTH)
        .env_remove(protocol::env_vars::ACP_HOST_MAX_DEPTH);
    for name in MODEL_ENV {
        cmd.env_remove(name);
    }
    cmd.args([
        "batch",
        "--jobs",
        "1",
        "--json-summary",
        "--agent",
        &agent,
        "jobs.ndjson",
    ]);
    let out = run_to_end(&mut cmd);
    assert_eq!(acp_tests::code(&out), 1, "{}", stderr(&out));
    let mut records = super::common::records(&out);
    // The last line totals the batch.
    let summary = records.pop().unwrap();
    protocol::schema::check_keys(
        &protocol::schema::output("batch-summary.json").unwrap(),
        &summary,
    )
    .unwrap_or_else(|e| panic!("{e}: {summary}"));
    assert_eq!(
        summary,
        json!({"type": "summary", "completed": 1, "failed": 1, "notStarted": 0,
            "usage": {"inputTokens": 10_010, "outputTokens": 25, "totalTokens": 10_035}})
    );
    assert_eq!(records.len(), 2, "one record per line");
    let schema = protocol::schema::output("batch-result.json").unwrap();
    for record in &records {
        protocol::schema::check_keys(&schema, record).unwrap_or_else(|e| panic!("{e}: {record}"));
    }
    let by_id = |id: &str| records.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(by_id("a")["status"], "completed");
    assert_eq!(
        by_id("a")["usage"],
        json!({"inputTokens": 10, "outputTokens": 5, "totalTokens": 15})
    );
    assert_eq!(by_id("b")["status"], "over-budget");
    assert_eq!(
        by_id("b")["error"],
        "used 10,020 tokens, over the token budget of 10,000"
    );
    assert!(
        stderr(&out).contains("; usage: 10,035 tokens (10,010 in, 25 out)\n"),
        "{}",
        stderr(&out)
    );
    assert_none_left(dir.path());
}

#[test]
fn an_agent_reporting_as_opencode_does_is_recorded_and_held_to_its_budgets_at_the_end() {
    // opencode answers the prompt with `usage` and sends the session's cost in a `usage_update`
    // (no token counts in it): the mock agent's `opencode-usage` scenario does the same.
    let dir = temp();
    let agent = mock(&["opencode-usage", "--tokens", "1000", "--cost", "0.05"]);
    let mut cmd = host_run(dir.path());
    cmd.args(["--json", "--agent", &agent, "count"]);
    let (_, result) = json_run(&mut cmd, 0);
    assert_eq!(
        result["usage"],
        json!({"inputTokens": 750, "outputTokens": 250, "totalTokens": 1000,
            "cachedReadTokens": 10, "cost": {"amount": 0.05, "currency": "USD"}}),
        "{result}"
    );
    for (flag, limit, error) in [
        (
            "--token-budget",
            "999",
            "used 1,000 tokens, over the token budget of 999",
        ),
        (
            "--cost-budget",
            "0.04",
            "spent 0.0500 USD, over the cost budget of 0.0400 USD",
        ),
    ] {
        let mut cmd = host_run(dir.path());
        cmd.args(["--json", flag, limit, "--agent", &agent, "count"]);
        let (_, result) = json_run(&mut cmd, 7);
        assert_eq!(result["status"], "over-budget", "{flag}: {result}");
        assert_eq!(result["error"], error);
        assert_eq!(
            result["output"], "counted",
            "the turn had ended: its answer is kept"
        );
    }
    assert_none_left(dir.path());
}

#[test]
fn a_child_gets_at_most_what_is_left_of_its_parents_budget() {
    let dir = temp();
    super::children::mock_definition(
        dir.path(),
        "budget",
        &format!("echo-env {}", protocol::env_vars::ACP_HOST_TOKEN_BUDGET),
    );
    // The parent spends 11 of its 20,000 before it delegates: 19,989 are left for the child.
    let parent = MockLlm::builder()
        .reply_with_usage(delegate("call_a", "budget", "show"), Usage::new(10, 1))
        .reply_with_usage(Reply::text(["done"]), Usage::new(20, 2))
        .reply_with_usage(delegate("call_b", "budget", "show"), Usage::new(10, 1))
        .reply_with_usage(Reply::text(["done"]), Usage::new(20, 2))
        .start();
    let children = MockLlm::start(Vec::new());
    let mut cmd = tree_run(dir.path(), &parent, &children, &[]);
    cmd.args(["--token-budget", "20000", "delegate"]);
    let (_, result) = json_run(&mut cmd, 0);
    assert_eq!(result["usage"]["totalTokens"], 33, "{result}");
    // The mock child reports no usage: under a budget that is an error its parent is told of,
    // with what it said.
    let unheld = "subagent budget ended error (stop reason end_turn): the agent reports no usage; \
                  the budget cannot be held\n\nIts output so far:\n";
    let told = parent.requests()[1].tool_result("call_a").unwrap();
    assert_eq!(told, format!("{unheld}ACP_HOST_TOKEN_BUDGET=19989"));
    // Its own --subagent-token-budget is lower: that holds.
    let mut cmd = tree_run(
        dir.path(),
        &parent,
        &children,
        &["--subagent-token-budget", "50"],
    );
    cmd.args(["--token-budget", "20000", "delegate"]);
    json_run(&mut cmd, 0);
    let told = parent.requests()[3].tool_result("call_b").unwrap();
    assert_eq!(told, format!("{unheld}ACP_HOST_TOKEN_BUDGET=50"));
    assert_none_left(dir.path());
}

#[test]
fn a_definitions_cost_budget_holds_and_only_lowers_the_flags() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    let defs = temp();
    // The agent comes from --agent; the definition brings only its budget.
    std::fs::write(
        defs.path().join("priced.md"),
        "---\ndescription: d\nrun:\n  costBudget: 0.02\n---\nB\n",
    )
    .unwrap();
    let prices = [
        "--context-window",
        "1000",
        "--price-input",
        "2",
        "--price-output",
        "8",
    ];
    let run_subagent = |llm: &MockLlm, extra: &[&str]| {
        let mut cmd = acp_child_json_run(dir.path(), llm, &prices);
        cmd.arg("--subagents")
            .arg(defs.path())
            .args(["--subagent", "priced"])
            .args(extra)
            .arg("read the notes");
        cmd
    };
    // 10,000 in and 20 out at 2 and 8 per million: 0.02016 USD, over the definition's 0.02.
    let llm = hanging_after(Usage::new(10_000, 20));
    let (_, result) = json_run(&mut run_subagent(&llm, &[]), 7);
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(
        result["error"],
        "spent 0.0202 USD, over the cost budget of 0.0200 USD"
    );
    // A larger flag does not raise it; a smaller one lowers it.
    let llm = hanging_after(Usage::new(10_000, 20));
    let (_, result) = json_run(&mut run_subagent(&llm, &["--cost-budget", "5"]), 7);
    assert_eq!(
        result["error"],
        "spent 0.0202 USD, over the cost budget of 0.0200 USD"
    );
    let llm = hanging_after(Usage::new(10_000, 20));
    let (_, result) = json_run(&mut run_subagent(&llm, &["--cost-budget", "0.01"]), 7);
    assert_eq!(
        result["error"],
        "spent 0.0202 USD, over the cost budget of 0.0100 USD"
    );
    assert_none_left(dir.path());
}

#[test]
fn a_background_childs_spending_counts_once_in_the_turn_that_gets_its_result() {
    let dir = temp();
    let parent = MockLlm::builder()
        .reply_with_usage(
            delegate_in_background("call_bg", "acp-child", "task a"),
            Usage::new(10, 1),
        )
        .reply_with_usage(await_task("call_out", "subagent-1"), Usage::new(20, 2))
        .reply_with_usage(await_task("call_again", "subagent-1"), Usage::new(25, 2))
        .reply_with_usage(Reply::text(["done"]), Usage::new(30, 3))
        .start();
    let children = MockLlm::builder()
        .reply_with_usage(Reply::text(["a done"]), Usage::new(100, 5))
        .start();
    let (_, result) = json_run(
        tree_run(dir.path(), &parent, &children, &[]).arg("delegate in the background"),
        0,
    );
    assert_eq!(result["output"], "done");
    // 93 of the parent's own and 105 of its child's, counted once though its result was asked
    // for twice.
    assert_eq!(
        result["usage"],
        json!({"inputTokens": 185, "outputTokens": 13, "totalTokens": 198}),
        "{result}"
    );
    assert_none_left(dir.path());
}

/// What acp-child estimates a request it streamed at, its server reporting no usage: the body at
/// four bytes a token, the output the larger of its deltas and its bytes at four a token.
fn estimated(request: &acp_tests::mock_llm::RecordedRequest, deltas: u64, bytes: u64) -> Value {
    let input = (request.raw_body.len() as u64).div_ceil(4);
    let output = deltas.max(bytes.div_ceil(4));
    json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output,
        "estimated": true})
}

#[test]
fn a_server_that_reports_no_usage_gets_an_estimate_marked_as_one() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    let llm = MockLlm::builder()
        .no_usage()
        .reply(read_notes("call_1"))
        .reply(Reply::text(["one", " two", " three"]))
        .start();
    let (records, result) = json_run(
        acp_child_json_run(dir.path(), &llm, &["--context-window", "100000"]).arg("read the notes"),
        0,
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    // The tool call streamed its opening (the name) and one piece of arguments.
    let arguments = json!({"path": "notes.txt"}).to_string();
    let first = estimated(
        &requests[0],
        2,
        ("read_file".len() + arguments.len()) as u64,
    );
    let second = estimated(&requests[1], 3, "one two three".len() as u64);
    let total = |field: &str| first[field].as_u64().unwrap() + second[field].as_u64().unwrap();
    assert_eq!(
        result["usage"],
        json!({"inputTokens": total("inputTokens"), "outputTokens": total("outputTokens"),
            "totalTokens": total("totalTokens"), "estimated": true}),
        "{result}"
    );
    let updates = usage_updates(&records);
    assert_eq!(updates.len(), 2, "{records:#?}");
    assert_eq!(updates[0]["used"], first["inputTokens"]);
    assert_eq!(updates[0]["_meta"]["acp-host/usage"]["estimated"], true);
    assert_none_left(dir.path());
}

/// The `session_info_update`s of our session carrying the usage extension, in order.
fn info_usage(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["type"] == "update" && r.get("sessionId").is_none_or(Value::is_null))
        .map(|r| &r["update"])
        .filter(|u| u["sessionUpdate"] == "session_info_update")
        .map(|u| &u["_meta"]["acp-host/usage"])
        .collect()
}

#[test]
fn without_a_context_window_the_counts_and_cost_still_arrive_mid_turn_and_a_budget_holds() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    let prices = ["--price-input", "2", "--price-output", "8"];
    let llm = MockLlm::builder()
        .reply_with_usage(read_notes("call_1"), Usage::new(100, 20))
        .reply_with_usage(Reply::text(["done"]), Usage::new(200, 10))
        .start();
    let (records, result) = json_run(
        acp_child_json_run(dir.path(), &llm, &prices).arg("read the notes"),
        0,
    );
    assert!(
        usage_updates(&records).is_empty(),
        "no window, no usage_update"
    );
    let infos = info_usage(&records);
    assert_eq!(infos.len(), 2, "{records:#?}");
    assert_eq!(infos[0]["totalTokens"], 120);
    assert!((infos[0]["cost"]["amount"].as_f64().unwrap() - 0.000_36).abs() < 1e-12);
    assert_eq!(infos[1]["totalTokens"], 330);
    let cost = &result["usage"]["cost"];
    assert_eq!(cost["currency"], "USD", "{result}");
    assert!((cost["amount"].as_f64().unwrap() - 0.000_84).abs() < 1e-12);

    // The first reply's counts reach acp-host before the turn ends: a token budget and a cost
    // budget each cancel a turn whose second request never gets an answer.
    for (budget, error) in [
        (
            ["--token-budget", "10000"],
            "used 10,020 tokens, over the token budget of 10,000",
        ),
        (
            ["--cost-budget", "0.02"],
            "spent 0.0202 USD, over the cost budget of 0.0200 USD",
        ),
    ] {
        let llm = hanging_after(Usage::new(10_000, 20));
        let mut cmd = acp_child_json_run(dir.path(), &llm, &prices);
        cmd.args(budget).arg("read the notes");
        let (_, result) = json_run(&mut cmd, 7);
        assert_eq!(result["status"], "over-budget", "{result}");
        assert_eq!(result["error"], error);
        assert_none_left(dir.path());
    }
}

#[test]
fn acp_child_holds_the_runs_budget_and_sends_no_request_that_would_pass_it() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    // The first request alone (its system prompt, its tools) is far past 20 tokens.
    let llm = MockLlm::start(vec![Reply::text(["never"])]);
    let mut cmd = acp_child_json_run(dir.path(), &llm, &[]);
    cmd.args(["--token-budget", "20", "hi"]);
    let (_, result) = json_run(&mut cmd, 7);
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(result["stopReason"], "max_tokens");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("used 0 tokens, and the next model request (about ")
            && error.ends_with(
                " tokens) would pass the token budget of 20: the agent ended its turn before \
                 sending it"
            ),
        "{error}"
    );
    assert!(llm.requests().is_empty(), "nothing was sent");
    assert_eq!(result["usage"], Value::Null, "nothing spent");
    assert!(result.get("warnings").is_none(), "held: {result}");

    // No window (so no usage_update): a turn of tool calls stops before the request that would
    // pass the budget, not after it, and not at the turn's end.
    let llm = MockLlm::builder()
        .reply_with_usage(read_notes("call_1"), Usage::new(2_000, 100))
        .reply_with_usage(read_notes("call_2"), Usage::new(2_000, 100))
        .reply_with_usage(read_notes("call_3"), Usage::new(2_000, 100))
        .reply_with_usage(Reply::text(["done"]), Usage::new(2_000, 100))
        .start();
    let mut cmd = acp_child_json_run(dir.path(), &llm, &[]);
    cmd.args(["--token-budget", "5000", "read the notes"]);
    let (_, result) = json_run(&mut cmd, 7);
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(llm.requests().len(), 2, "the third would have passed 5,000");
    assert_eq!(result["usage"]["totalTokens"], 4_200);
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .starts_with("used 4,200 tokens, and the next model request (about "),
        "{result}"
    );
    assert_none_left(dir.path());
}

#[test]
fn a_reply_streaming_past_the_budget_is_cut_off_where_it_passes() {
    let dir = temp();
    // The same request once without a budget, to learn its size; then 200 words, slowly, so
    // the cut is seen at the server.
    let llm = MockLlm::builder()
        .no_usage()
        .reply(Reply::text(["ok"]))
        .reply(Reply::Slow {
            chunks: vec!["w ".to_owned(); 200],
            interval: Duration::from_millis(10),
        })
        .start();
    let (_, result) = json_run(acp_child_json_run(dir.path(), &llm, &[]).arg("count"), 0);
    let input = (llm.requests()[0].raw_body.len() as u64).div_ceil(4);
    assert_eq!(result["usage"]["inputTokens"], input);
    // Room for ten tokens of answer: the eleventh delta passes it.
    let budget = (input + 10).to_string();
    let mut cmd = acp_child_json_run(dir.path(), &llm, &[]);
    cmd.args(["--token-budget", &budget, "count"]);
    let (_, result) = json_run(&mut cmd, 7);
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(result["stopReason"], "max_tokens");
    assert_eq!(result["output"], "w ".repeat(11));
    assert_eq!(result["usage"]["totalTokens"], input + 11);
    assert_eq!(result["usage"]["estimated"], true);
    assert_eq!(
        result["error"],
        format!(
            "used {} tokens, over the token budget of {}",
            protocol::usage::thousands(input + 11),
            protocol::usage::thousands(input + 10)
        )
    );
    assert!(llm.wait_for_stream_ends(2, acp_tests::HANG_GUARD));
    let end = llm.stream_ends()[1];
    assert!(end.sent < end.total, "the stream was left: {end:?}");
    assert_none_left(dir.path());
}

#[test]
fn a_child_on_a_server_that_reports_no_usage_is_estimated_in_children_and_the_parents_total() {
    let dir = temp();
    let parent = MockLlm::builder()
        .reply_with_usage(delegate("call_a", "acp-child", "task a"), Usage::new(10, 1))
        .reply_with_usage(Reply::text(["done"]), Usage::new(20, 2))
        .start();
    let children = MockLlm::builder()
        .no_usage()
        .reply(Reply::text(["a", " done"]))
        .start();
    let (_, result) = json_run(
        tree_run(dir.path(), &parent, &children, &[]).arg("delegate"),
        0,
    );
    assert_eq!(result["output"], "done");
    let child = &result["children"][0];
    assert_eq!(child["usage"]["estimated"], true, "{result}");
    let requests = children.requests();
    assert_eq!(requests.len(), 1);
    let estimate = estimated(&requests[0], 2, "a done".len() as u64);
    assert_eq!(child["usage"], estimate, "{result}");
    // The parent's own figures were reported, its child's estimated: the sum is an estimate.
    assert_eq!(result["usage"]["estimated"], true);
    assert_eq!(
        result["usage"]["totalTokens"],
        33 + estimate["totalTokens"].as_u64().unwrap()
    );
    assert_none_left(dir.path());
}
