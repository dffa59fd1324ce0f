// fp4moe: the command-line tool. `fp4moe --help` lists the subcommands; docs/cli.md describes them.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/names.h"
#include "tools/commands.h"
#include "tools/foreign_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"fp4moe: NVFP4 Mixture-of-Experts inference (CPU reference + Hopper kernels)"};
  app.require_subcommand(1);
  fp4moe::tools::register_version_command(app);
  fp4moe::tools::register_inspect_command(app);
  fp4moe::tools::register_quantize_command(app);
  fp4moe::tools::register_plan_command(app);
  fp4moe::tools::register_tokenize_command(app);
  fp4moe::tools::register_generate_command(app);
  fp4moe::tools::register_bench_one_batch_command(app);
  fp4moe::tools::register_serve_command(app);
  fp4moe::tools::register_bench_serving_command(app);
  fp4moe::tools::register_tune_command(app);
  fp4moe::tools::register_bench_command(app);
  fp4moe::tools::register_analyze_command(app);
  // An option given an empty value ("--dump-logits ''", an unset shell variable) is a usage error, not the option
  // left out (which silently meant no dump, random calibration prompts, uniform routing; an empty FP4MOE_API_KEY
  // served without authentication). The options whose empty value means something are exempt.
  std::function<void(CLI::App*)> refuse_empty_values = [&](CLI::App* sub) {
    sub->parse_complete_callback([sub] {
      for (const CLI::Option* o : sub->get_options()) {
        if (o->get_items_expected_max() == 0) continue;  // a flag
        const std::string name = o->get_name(false, true);
        if (name == "--text" || name == "--constrained-json-whitespace-pattern") continue;
        const std::string env = o->get_envname();
        if (o->count() == 0 && !env.empty()) {
          const char* v = std::getenv(env.c_str());
          if (v != nullptr && *v == '\0')
            throw CLI::ValidationError(env, "is set but empty (for " + name + "): give a value or unset it");
        }
        for (const std::string& r : o->results()) {
          if (r.empty()) throw CLI::ValidationError(o->get_name(), "is empty: give a value or leave the option out");
        }
      }
    });
    for (CLI::App* child : sub->get_subcommands({})) refuse_empty_values(child);
  };
  for (CLI::App* sub : app.get_subcommands({})) refuse_empty_values(sub);
  // A word where a subcommand is expected that names none ("fp4moe serv", "fp4moe bench gem") is named, with the
  // closest subcommand (CLI11 would say only "A subcommand is required").
  {
    CLI::App* level = &app;
    std::string path = "fp4moe";
    for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
      const std::vector<CLI::App*> subs = level->get_subcommands({});
      if (subs.empty()) break;  // a positional argument of the subcommand
      std::vector<std::string> names;
      for (const CLI::App* sub : subs) names.push_back(sub->get_name());
      if (std::find(names.begin(), names.end(), argv[i]) == names.end()) {
        std::string list;
        for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
        const auto best = fp4moe::closest_name(argv[i], names);
        std::fprintf(stderr, "%s: unknown subcommand '%s'%s; the subcommands are %s (%s --help)\n", path.c_str(),
                     argv[i], best ? (" (did you mean '" + *best + "'?)").c_str() : "", list.c_str(), path.c_str());
        return 2;
      }
      level = level->get_subcommand(argv[i]);
      path += std::string(" ") + argv[i];
    }
    // An option the command does not have ("--max-num-batched-tokens", "--max-running-request") is named with the
    // command's closest option, or what fp4moe has for another server's flag (CLI11 would say only "The following
    // arguments were not expected"). Tokens after "--" are positional; the value words a known option takes are its
    // own, whatever they look like ("--text ---", "--api-key --secret"), as CLI11 takes them.
    for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
      const std::string_view arg = argv[i];
      if (arg.size() < 3 || arg.substr(0, 2) != "--") continue;
      const std::string name(arg.substr(0, arg.find('=')));
      if (const CLI::Option* known = level->get_option_no_throw(name)) {
        if (arg.find('=') == std::string_view::npos) i += std::max(0, known->get_items_expected_min());
        continue;
      }
      std::vector<std::string> names;
      for (const CLI::Option* o : level->get_options()) {
        for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
      }
      const std::optional<std::string> hint = fp4moe::tools::foreign_flag_hint(path, name);
      const std::optional<std::string> best = hint ? std::nullopt : fp4moe::closest_name(name, names);
      std::fprintf(stderr, "%s: unknown option %s%s (%s --help lists the options)\n", path.c_str(), name.c_str(),
                   hint   ? ("; " + *hint).c_str()
                   : best ? (" (did you mean " + *best + "?)").c_str()
                          : "",
                   path.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help / version text, exit 0); a usage error exits 2, as argparse and getopt
    // tools do, not with CLI11's own codes (105-114).
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);  // what the command printed comes before its error, when both go to one file or pipe
    std::fprintf(stderr, "fp4moe: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
