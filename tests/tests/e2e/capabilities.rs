//! End-to-end: start-time capabilities. A persona, a model and a tool filter reach acp-child (as
//! ACP's session system prompt, its `model` config option and acp-host's start extension) and
//! change what it sends the mock model; a foreign agent (the mock's `configurable` scenario) gets
//! what it advertises, a persona degrades to a preamble only in append mode, and anything it
//! cannot honour is refused before the prompt, with nothing sent.

use std::path::Path;
use std::process::Command;

use acp_tests::mock_llm::{MockLlm, Reply};
use acp_tests::{code, host_run, run_to_end, stderr, stdout};
use protocol::capabilities::preamble;
use serde_json::{Value, json};

use super::common::{acp_child_json_run, json_run, mock, result_record};

const MODEL: &str = "mock-model";

/// `acp-host run --json` of acp-child on the mock model, offering `other-model` too.
fn acp_child_run(dir: &Path, llm: &MockLlm) -> Command {
    acp_child_json_run(dir, llm, &["--models", "other-model"])
}

fn persona_file(dir: &Path, text: &str) -> String {
    let path = dir.join("persona.md");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn system_text(request: &acp_tests::mock_llm::RecordedRequest) -> String {
    request.messages()[0]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn persona_model_and_tools_reach_acp_child_and_change_its_model_requests() {
    let dir = tempfile::tempdir().unwrap();
    let llm = MockLlm::start(vec![Reply::text(["ok"])]);
    let persona = persona_file(dir.path(), "Review as {{model}} in {{cwd}}.");
    let (_, result) = json_run(
        acp_child_run(dir.path(), &llm).args([
            "--persona",
            &persona,
            "--model",
            "other-model",
            "--tools",
            "read_file,search,run_command",
            "--deny-tools",
            "run_command",
            "go",
        ]),
        0,
    );
    assert_eq!(result["personaDelivery"], "system-prompt");
    assert_eq!(result["output"], "ok");
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].body["model"], "other-model");
    assert_eq!(requests[0].tool_names(), ["read_file", "search"]);
    let canonical = dir.path().canonicalize().unwrap();
    let system = system_text(&requests[0]);
    // Identity first: the persona, then acp-child's own guidance and tools.
    assert!(
        system.starts_with(&format!(
            "Review as other-model in {}.\n\nYou are acp-child, a careful coding agent running \
             as the model other-model",
            canonical.display()
        )),
        "append puts the persona first: {system}"
    );
    // The built-in persona names only the tools the session is given, and with no write or
    // command among them, claims no approvals.
    assert!(
        system.ends_with(&format!(
            "read_file and search to look around. Paths are relative to {}; you cannot reach \
             outside it. Be concise: say what you did and what you found.",
            canonical.display()
        )),
        "{system}"
    );
    for filtered in ["write_file", "edit_file", "run_command", "list_dir"] {
        assert!(!system.contains(filtered), "{filtered}: {system}");
    }
    assert!(
        system.contains("using the tools you are given:\nread_file and search to look around."),
        "{system}"
    );
    assert!(
        system.ends_with("Be concise: say what you did and what you found."),
        "{system}"
    );
    assert_eq!(requests[0].last_user_text().as_deref(), Some("go"));
}

#[test]
fn an_override_persona_replaces_acp_childs_and_an_empty_allow_list_offers_no_tools() {
    let dir = tempfile::tempdir().unwrap();
    let llm = MockLlm::start(vec![Reply::text(["ok"])]);
    let persona = persona_file(dir.path(), "Only {{model}}.");
    let out = run_to_end(acp_child_run(dir.path(), &llm).args([
        "--persona",
        &persona,
        "--persona-mode",
        "override",
        "--tools",
        "",
        "go",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let requests = llm.requests();
    assert_eq!(system_text(&requests[0]), "Only mock-model.");
    assert!(requests[0].tool_names().is_empty());
    assert_eq!(requests[0].body["model"], MODEL);
}

#[test]
fn what_acp_child_cannot_honour_fails_the_session_before_any_model_request() {
    let dir = tempfile::tempdir().unwrap();
    let llm = MockLlm::start(vec![Reply::text(["never"])]);
    let (_, result) = json_run(
        acp_child_run(dir.path(), &llm).args(["--tools", "read_fil", "go"]),
        1,
    );
    assert_eq!(result["errorKind"], "handshake");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("unknown tool name read_fil; the tools are read_file, list_dir"),
        "{error}"
    );
    // A malformed persona is refused by acp-host itself, before acp-child is spawned (the
    // rule is the same one, `protocol::capabilities::template`).
    let persona = persona_file(dir.path(), "Be {{modle}}.");
    let out = run_to_end(acp_child_run(dir.path(), &llm).args(["--persona", &persona, "go"]));
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("persona template: unknown variable `{{modle}}`"),
        "{}",
        stderr(&out)
    );
    let (_, result) = json_run(
        acp_child_run(dir.path(), &llm).args(["--model", "gpt-9", "go"]),
        1,
    );
    assert_eq!(result["errorKind"], "capability");
    assert_eq!(
        result["error"],
        format!(
            "capability model: agent {} does not offer model gpt-9; it offers: mock-model, other-model",
            shell_words::join([
                "acp-child",
                "--model",
                MODEL,
                "--models",
                "other-model",
                "--base-url",
                &llm.base_url(),
                "--state-dir",
                &dir.path().join(".state").display().to_string(),
            ])
        )
    );
    assert!(llm.requests().is_empty(), "nothing reached the model");
}

/// `acp-host run --json` of the mock's `configurable` scenario, logging what it receives.
fn foreign(dir: &Path, advertise: &str) -> (Command, std::path::PathBuf) {
    let log = dir.join("mock.log");
    // Each run logs afresh.
    let _ = std::fs::remove_file(&log);
    let mut args = vec!["configurable", "--log"];
    let log_text = log.display().to_string();
    args.push(&log_text);
    if !advertise.is_empty() {
        args.extend(["--advertise", advertise]);
    }
    let mut cmd = host_run(dir);
    cmd.args(["--json", "--agent", &mock(&args)]);
    (cmd, log)
}

/// The messages the mock received (its stdin closing aside).
fn received(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| *line != "eof")
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_foreign_agent_asked_for_tools_is_refused_with_nothing_sent() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cmd, log) = foreign(dir.path(), "system-prompt");
    let out = run_to_end(cmd.args(["--tools", "read_file", "hi"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "error");
    assert_eq!(result["errorKind"], "capability");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("capability tools: agent ")
            && error.contains(
                "cannot take a tool filter: it does not advertise the acp-host/start extension"
            ),
        "{error}"
    );
    assert_eq!(result["sessionId"], Value::Null);
    assert_eq!(received(&log), ["initialize"], "no session, no prompt");

    // Human mode says the same on stderr, nothing on stdout.
    let out = run_to_end(host_run(dir.path()).args([
        "--agent",
        &mock(&["configurable"]),
        "--deny-tools",
        "run_command",
        "hi",
    ]));
    assert_eq!(code(&out), 1);
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).starts_with("acp-host: error: capability tools: agent "),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_foreign_agent_advertising_the_extension_gets_the_tool_filter() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cmd, _) = foreign(dir.path(), "tools");
    let out = run_to_end(cmd.args(["--tools", "read_file", "--deny-tools", "shell", "hi"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let output = result_record(&out)["output"].as_str().unwrap().to_owned();
    let meta_line = output.lines().find(|l| l.starts_with("meta ")).unwrap();
    let meta: Value = serde_json::from_str(&meta_line["meta ".len()..]).unwrap();
    assert_eq!(
        meta,
        json!({"acp-host/start": {"version": 1, "tools": {"allow": ["read_file"], "deny": ["shell"]}}})
    );
}

#[test]
fn a_foreign_agent_selects_an_offered_model_and_refuses_another_naming_the_offered_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cmd, log) = foreign(dir.path(), "");
    let out = run_to_end(cmd.args(["--model", "mock-large", "hi"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let output = result_record(&out)["output"].as_str().unwrap().to_owned();
    assert_eq!(
        output,
        "model mock-large\nsystemPrompt null\nmeta null\nprompt hi"
    );
    assert_eq!(
        received(&log),
        [
            "initialize",
            "session/new",
            "session/set_config_option",
            "session/prompt"
        ]
    );

    let (mut cmd, log) = foreign(dir.path(), "");
    let (_, result) = json_run(cmd.args(["--model", "mock-huge", "hi"]), 1);
    assert_eq!(result["errorKind"], "capability");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("capability model: agent ")
            && error.ends_with("does not offer model mock-huge; it offers: mock-small, mock-large"),
        "{error}"
    );
    assert_eq!(
        received(&log),
        ["initialize", "session/new"],
        "not prompted"
    );
}

#[test]
fn a_persona_is_a_system_prompt_where_advertised_else_a_preamble_unless_strict() {
    let dir = tempfile::tempdir().unwrap();
    let persona = persona_file(dir.path(), "Be brief.");
    // Advertised: sent in session/new, the prompt untouched.
    let (mut cmd, _) = foreign(dir.path(), "system-prompt");
    let (_, result) = json_run(cmd.args(["--persona", &persona, "hi"]), 0);
    assert_eq!(result["personaDelivery"], "system-prompt");
    assert_eq!(
        result["output"],
        "model mock-small\nsystemPrompt {\"mode\":\"append\",\"content\":[{\"type\":\"text\",\"text\":\"Be brief.\"}]}\nmeta null\nprompt hi"
    );
    // Override needs the override mode.
    let (mut cmd, log) = foreign(dir.path(), "system-prompt");
    let out = run_to_end(cmd.args(["--persona", &persona, "--persona-mode", "override", "hi"]));
    assert_eq!(code(&out), 1);
    assert_eq!(result_record(&out)["errorKind"], "capability");
    assert_eq!(received(&log), ["initialize"]);

    // Not advertised: a delimited preamble of the prompt.
    let (mut cmd, _) = foreign(dir.path(), "");
    let (_, result) = json_run(cmd.args(["--persona", &persona, "hi"]), 0);
    assert_eq!(result["personaDelivery"], "preamble");
    assert_eq!(
        result["output"],
        format!(
            "model mock-small\nsystemPrompt null\nmeta null\nprompt {}",
            preamble("Be brief.", "hi")
        )
    );
    // ... unless strict.
    let (mut cmd, log) = foreign(dir.path(), "");
    let out = run_to_end(cmd.args(["--persona", &persona, "--persona-mode", "strict", "hi"]));
    assert_eq!(code(&out), 1);
    let result = result_record(&out);
    assert_eq!(result["errorKind"], "capability");
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .contains("takes no system prompt (no sessionCapabilities.systemPrompt), and persona mode strict does not fall back"),
        "{result}"
    );
    assert_eq!(received(&log), ["initialize"]);
}

#[test]
fn a_preamble_persona_gets_its_cwd_and_model_by_the_strict_rule() {
    let dir = tempfile::tempdir().unwrap();
    let persona = persona_file(dir.path(), "Work in {{cwd}} as {{ model }}.");
    let (mut cmd, _) = foreign(dir.path(), "");
    let (records, result) = json_run(cmd.args(["--persona", &persona, "hi"]), 0);
    assert_eq!(result["personaDelivery"], "preamble");
    let cwd = records[0]["cwd"].as_str().unwrap().to_owned();
    // No --model: the agent's current model.
    assert_eq!(
        result["output"],
        format!(
            "model mock-small\nsystemPrompt null\nmeta null\nprompt {}",
            preamble(&format!("Work in {cwd} as mock-small."), "hi")
        )
    );
    let (mut cmd, _) = foreign(dir.path(), "");
    let (_, result) = json_run(
        cmd.args(["--persona", &persona, "--model", "mock-large", "hi"]),
        0,
    );
    assert_eq!(
        result["output"],
        format!(
            "model mock-large\nsystemPrompt null\nmeta null\nprompt {}",
            preamble(&format!("Work in {cwd} as mock-large."), "hi")
        )
    );
    // An agent that names no model: {{model}} has no value, and the run is refused unprompted.
    let log = dir.path().join("echo.log");
    let echo = mock(&["echo-prompt", "--log", &log.display().to_string()]);
    let (_, result) = json_run(
        host_run(dir.path()).args(["--json", "--agent", &echo, "--persona", &persona, "hi"]),
        1,
    );
    assert_eq!(result["errorKind"], "capability");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("capability persona: agent ")
            && error.ends_with(
                " takes no system prompt and names no current model (no session config option \
                 of category model), so the persona preamble's {{model}} has no value; pass \
                 --model (or run.model in the definition), or drop it from the persona"
            ),
        "{error}"
    );
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap()
            .contains("session/prompt"),
        "prompted"
    );
    // A malformed reference: a usage error, nothing spawned.
    let pid_file = dir.path().join("mock.pid");
    let bad = persona_file(dir.path(), "Work as {{modle}}.");
    let agent = mock(&["hello", "--pid-file", &pid_file.display().to_string()]);
    let out = run_to_end(host_run(dir.path()).args(["--agent", &agent, "--persona", &bad, "hi"]));
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: --persona {bad}: persona template: unknown variable `{{{{modle}}}}` \
             (the variables are {{{{model}}}}, {{{{cwd}}}})\n"
        )
    );
    assert!(!pid_file.exists(), "the agent was spawned");
}

#[test]
fn a_definition_asks_through_the_same_path_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let subagents = dir.path().join("subagents");
    std::fs::create_dir_all(&subagents).unwrap();
    let log = dir.path().join("mock.log");
    let agent = mock(&["configurable", "--log", &log.display().to_string()]);
    std::fs::write(
        subagents.join("picky.md"),
        format!(
            "---\ndescription: d\nrun:\n  agent: {}\n  model: mock-large\n  tools: [read_file]\n---\nBe picky.\n",
            serde_json::to_string(&agent).unwrap()
        ),
    )
    .unwrap();
    acp_tests::approve_definition(&subagents.join("picky.md"));
    let (_, result) = json_run(
        host_run(dir.path()).args(["--json", "--subagent", "picky", "hi"]),
        1,
    );
    assert_eq!(result["errorKind"], "capability");
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .starts_with("capability tools: agent "),
        "{result}"
    );
    assert_eq!(received(&log), ["initialize"]);
    // A definition's model and persona go the same way; --model wins over the definition's.
    std::fs::write(
        subagents.join("sized.md"),
        format!(
            "---\ndescription: d\nrun:\n  agent: {}\n  model: mock-large\n---\nBe sized.\n",
            serde_json::to_string(&mock(&["configurable"])).unwrap()
        ),
    )
    .unwrap();
    acp_tests::approve_definition(&subagents.join("sized.md"));
    let sized = |extra: &[&str]| {
        let (_, result) = json_run(
            host_run(dir.path())
                .args(["--json", "--subagent", "sized"])
                .args(extra)
                .arg("hi"),
            0,
        );
        assert_eq!(result["personaDelivery"], "preamble");
        result["output"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        sized(&[]),
        format!(
            "model mock-large\nsystemPrompt null\nmeta null\nprompt {}",
            preamble("Be sized.", "hi")
        )
    );
    assert!(sized(&["--model", "mock-small"]).starts_with("model mock-small\n"));
    // A bad --persona-mode without a persona is a usage error, nothing spawned.
    let out = run_to_end(host_run(dir.path()).args(["--persona-mode", "strict", "hi"]));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: --persona-mode: there is no persona; pass --persona FILE or --subagent NAME\n"
    );
}

#[test]
fn a_resumed_acp_child_session_keeps_its_model_persona_and_tool_filter() {
    let dir = tempfile::tempdir().unwrap();
    let llm = MockLlm::start(vec![
        Reply::text(["first"]),
        Reply::text(["second"]),
        Reply::text(["third"]),
    ]);
    let persona = persona_file(dir.path(), "Answer as {{model}}.");
    let out = run_to_end(acp_child_run(dir.path(), &llm).args([
        "--persona",
        &persona,
        "--model",
        "other-model",
        "--tools",
        "read_file",
        "one",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let session = result_record(&out)["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned();
    // Resumed by a new acp-child process, with nothing asked at start: what the session was set
    // up with is restored from its file.
    let out = run_to_end(acp_child_run(dir.path(), &llm).args(["--resume", &session, "two"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(result_record(&out)["output"], "second");
    // A model asked when resuming is selected on the loaded session (its config options come
    // with the session/load answer); the rest is still kept.
    let out = run_to_end(
        acp_child_run(dir.path(), &llm).args(["--resume", &session, "--model", MODEL, "three"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[2].body["model"], MODEL);
    assert_eq!(requests[2].tool_names(), ["read_file"]);
    for request in &requests[..2] {
        assert_eq!(request.body["model"], "other-model");
        assert_eq!(request.tool_names(), ["read_file"]);
        assert!(
            system_text(request).starts_with("Answer as other-model.\n\nYou are acp-child"),
            "{}",
            system_text(request)
        );
    }
    assert_eq!(requests[1].last_user_text().as_deref(), Some("two"));
}

#[test]
fn the_models_the_server_lists_are_offered_and_a_failed_listing_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let llm = MockLlm::builder()
        .models(["listed-model", "mock-model"])
        .reply(Reply::text(["ok"]))
        .start();
    let (_, result) = json_run(
        acp_child_json_run(dir.path(), &llm, &[]).args(["--model", "listed-model", "go"]),
        0,
    );
    assert_eq!(result["output"], "ok");
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].body["model"], "listed-model");
    assert_eq!(llm.model_listings(), 1, "listed once per process");

    let failing = MockLlm::builder()
        .models_fail()
        .reply(Reply::text(["still ok"]))
        .start();
    let (_, result) = json_run(acp_child_json_run(dir.path(), &failing, &[]).arg("go"), 0);
    assert_eq!(result["output"], "still ok");
    assert_eq!(failing.requests()[0].body["model"], "mock-model");
    assert_eq!(failing.model_listings(), 1);
}
