#include "cli/completion_command.h"

#include <iostream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/exit_codes.h"

namespace gpuha::cli {

namespace {

// One command of the tree, by path ("gpuha", "gpuha/ctl", "gpuha/ctl/describe").
struct Flag {
  std::vector<std::string> names;  // "--output", "-o"
  std::string help;
  bool takes_value = false;
  std::vector<std::string> choices;  // from an IsMember check
};
struct Command {
  std::string path;
  std::string help;
  std::vector<std::string> subs;
  std::vector<Flag> flags;
  std::vector<std::string> arg_choices;  // positional arguments' IsMember choices
};

// CLI11 writes an IsMember check into the type name: "TEXT:{bash,zsh,fish}".
std::vector<std::string> Choices(const CLI::Option& o) {
  std::string type = o.get_type_name();
  size_t open = type.find('{'), close = type.rfind('}');
  if (open == std::string::npos || close == std::string::npos || close < open) return {};
  return absl::StrSplit(type.substr(open + 1, close - open - 1), ',', absl::SkipEmpty());
}

void Walk(const CLI::App& app, const std::string& path, std::vector<Command>* out) {
  Command c;
  c.path = path;
  c.help = app.get_description();
  std::vector<const CLI::App*> subs = app.get_subcommands([](const CLI::App*) { return true; });
  for (const CLI::App* s : subs) c.subs.push_back(s->get_name());
  for (const CLI::Option* o : app.get_options([](const CLI::Option*) { return true; })) {
    if (!o->nonpositional()) {
      std::vector<std::string> ch = Choices(*o);
      c.arg_choices.insert(c.arg_choices.end(), ch.begin(), ch.end());
      continue;
    }
    Flag f;
    for (const std::string& l : o->get_lnames()) f.names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) f.names.push_back("-" + s);
    f.help = o->get_description();
    f.takes_value = !o->get_type_name().empty();  // flags have no type (CLI11 help shows none)
    f.choices = Choices(*o);
    c.flags.push_back(std::move(f));
  }
  out->push_back(std::move(c));
  for (const CLI::App* s : subs) Walk(*s, path + "/" + s->get_name(), out);
}

std::string Words(const std::vector<std::string>& words) { return absl::StrJoin(words, " "); }

std::vector<std::string> FlagNames(const Command& c) {
  std::vector<std::string> names;
  for (const Flag& f : c.flags) names.insert(names.end(), f.names.begin(), f.names.end());
  return names;
}

// The tables bash and zsh share: subcommands and flags by path, and for
// "PATH:FLAG" the flag's choices (or that it takes a value), and for
// "PATH:ARG" the positional choices.
std::string ShellTables(const std::vector<Command>& tree, bool zsh) {
  auto assoc = [&](const std::string& name,
                   const std::vector<std::pair<std::string, std::string>>& kv) {
    std::string out = zsh ? absl::StrCat("  local -A ", name, "\n  ", name, "=(\n")
                          : absl::StrCat("  local -A ", name, "=(\n");
    for (const auto& [k, v] : kv) {
      out += zsh ? absl::StrCat("    '", k, "' '", v, "'\n")
                 : absl::StrCat("    ['", k, "']='", v, "'\n");
    }
    return out + "  )\n";
  };
  std::vector<std::pair<std::string, std::string>> subs, flags, takes, choices;
  for (const Command& c : tree) {
    subs.push_back({c.path, Words(c.subs)});
    flags.push_back({c.path, Words(FlagNames(c))});
    if (!c.arg_choices.empty()) choices.push_back({c.path + ":ARG", Words(c.arg_choices)});
    for (const Flag& f : c.flags) {
      for (const std::string& n : f.names) {
        if (!f.choices.empty())
          choices.push_back({c.path + ":" + n, Words(f.choices)});
        else if (f.takes_value)
          takes.push_back({c.path + ":" + n, "1"});
      }
    }
  }
  return assoc("subs", subs) + assoc("flags", flags) + assoc("takes", takes) +
         assoc("choices", choices);
}

std::string Bash(const std::vector<Command>& tree) {
  return absl::StrCat(R"(# gpuha completion for bash. Load it with:
#   source <(gpuha completion bash)
# or keep it in /usr/share/bash-completion/completions/gpuha.
_gpuha() {
)",
                      ShellTables(tree, false),
                      R"(  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local p=gpuha q w i all
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if [[ " ${subs[$p]} " == *" $w "* ]]; then p=$p/$w; fi
  done
  # A flag's value: its choices, or files. Flags of a parent apply below it.
  q=$p
  while :; do
    if [[ -n ${choices[${q}:${prev}]+x} ]]; then
      COMPREPLY=($(compgen -W "${choices[${q}:${prev}]}" -- "$cur"))
      return
    fi
    if [[ -n ${takes[${q}:${prev}]+x} ]]; then
      COMPREPLY=($(compgen -f -- "$cur"))
      return
    fi
    [[ $q == */* ]] || break
    q=${q%/*}
  done
  if [[ $cur == -* ]]; then
    all=${flags[$p]}
    q=$p
    while [[ $q == */*/* ]]; do q=${q%/*}; all="$all ${flags[$q]}"; done
    COMPREPLY=($(compgen -W "$all" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "${subs[$p]} ${choices[${p}:ARG]}" -- "$cur"))
  fi
}
complete -F _gpuha gpuha
)");
}

std::string Zsh(const std::vector<Command>& tree) {
  return absl::StrCat(R"(#compdef gpuha
# gpuha completion for zsh. Keep it as _gpuha in a directory of $fpath:
#   gpuha completion zsh > "${fpath[1]}/_gpuha"
# or load it in a running shell: source <(gpuha completion zsh)
_gpuha() {
)",
                      ShellTables(tree, true),
                      R"(  local cur=${words[CURRENT]} prev=${words[CURRENT-1]}
  local p=gpuha q w i all
  for ((i = 2; i < CURRENT; i++)); do
    w=${words[i]}
    if [[ " ${subs[$p]} " == *" $w "* ]]; then p=$p/$w; fi
  done
  q=$p
  while :; do
    if (( ${+choices[${q}:${prev}]} )); then
      compadd -- ${=choices[${q}:${prev}]}
      return
    fi
    if (( ${+takes[${q}:${prev}]} )); then
      _files
      return
    fi
    [[ $q == */* ]] || break
    q=${q%/*}
  done
  if [[ $cur == -* ]]; then
    all=${flags[$p]}
    q=$p
    while [[ $q == */*/* ]]; do q=${q%/*}; all="$all ${flags[$q]}"; done
    compadd -- ${=all}
  else
    compadd -- ${=subs[$p]} ${=choices[${p}:ARG]}
  fi
}
if [[ ${funcstack[1]} == _gpuha ]]; then
  _gpuha "$@"
else
  compdef _gpuha gpuha
fi
)");
}

std::string FishQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"'", "\\'"}}), "'");
}

std::string Fish(const std::vector<Command>& tree) {
  std::vector<std::string> known;
  for (const Command& c : tree) {
    if (c.path != "gpuha") known.push_back(c.path);
  }
  std::string out = absl::StrCat(R"(# gpuha completion for fish. Keep it as
#   gpuha completion fish > ~/.config/fish/completions/gpuha.fish
function __gpuha_path
    set -l known )",
                                 Words(known), R"(
    set -l p gpuha
    for w in (commandline -opc)[2..-1]
        if contains -- $p/$w $known
            set p $p/$w
        end
    end
    echo $p
end
complete -c gpuha -f
)");
  std::map<std::string, std::string> help;
  for (const Command& c : tree) help[c.path] = c.help;
  for (const Command& c : tree) {
    std::string here = absl::StrCat("test (__gpuha_path) = ", c.path);
    // A parent's flags apply to its subcommands too (CLI11 fallthrough).
    // The command or one below it: `gpuha/ctl/fail` must not match
    // `gpuha/ctl/failovers`.
    std::string below = c.path == "gpuha"
                            ? here
                            : absl::StrCat("string match -q -r -- ",
                                           FishQuote("^" + c.path + "(/|$)"), " (__gpuha_path)");
    for (const std::string& s : c.subs) {
      out += absl::StrCat("complete -c gpuha -n ", FishQuote(here), " -a ", s, " -d ",
                          FishQuote(help[c.path + "/" + s]), "\n");
    }
    if (!c.arg_choices.empty()) {
      out += absl::StrCat("complete -c gpuha -n ", FishQuote(here), " -a ",
                          FishQuote(Words(c.arg_choices)), "\n");
    }
    for (const Flag& f : c.flags) {
      std::string line = absl::StrCat("complete -c gpuha -n ", FishQuote(below));
      for (const std::string& n : f.names) {
        absl::StrAppend(&line, n.rfind("--", 0) == 0 ? " -l " : " -s ",
                        n.substr(n.find_first_not_of('-')));
      }
      if (!f.choices.empty()) {
        absl::StrAppend(&line, " -x -a ", FishQuote(Words(f.choices)));
      } else if (f.takes_value) {
        absl::StrAppend(&line, " -r -F");
      }
      out += absl::StrCat(line, " -d ", FishQuote(f.help), "\n");
    }
  }
  return out;
}

}  // namespace

std::string CompletionScript(const CLI::App& root, const std::string& shell) {
  std::vector<Command> tree;
  Walk(root, "gpuha", &tree);
  if (shell == "bash") return Bash(tree);
  if (shell == "zsh") return Zsh(tree);
  return Fish(tree);
}

CompletionCommand::CompletionCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("completion", "Print a shell completion script");
  app_->add_option("SHELL", shell_, "")->required()->check(CLI::IsMember({"bash", "zsh", "fish"}));
  app_->footer(
      "Examples:\n  source <(gpuha completion bash)\n"
      "  gpuha completion zsh > \"${fpath[1]}/_gpuha\"\n"
      "  gpuha completion fish > ~/.config/fish/completions/gpuha.fish");
}

int CompletionCommand::Run(const CLI::App& root) const {
  std::cout << CompletionScript(root, shell_);
  return kExitOk;
}

}  // namespace gpuha::cli
