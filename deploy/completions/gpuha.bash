# bash completion for gpuha (installed as
# /usr/share/bash-completion/completions/gpuha). Subcommands and flags are
# read from the binary's own --help, so they follow the installed version.
_gpuha() {
  local cur prev words cword
  _init_completion 2>/dev/null || {
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  }
  local gpuha="${words[0]}" sub="" i
  for ((i = 1; i < cword; i++)); do
    case "${words[i]}" in
      -*) ;;
      *) sub="${words[i]}"; break ;;
    esac
  done
  case "$prev" in
    --config|--store|--fault-script|--out|--cert|--key|--ca)
      COMPREPLY=($(compgen -f -- "$cur"))
      return ;;
  esac
  local help
  if [[ -z "$sub" ]]; then
    help="$("$gpuha" --help 2>/dev/null)"
    if [[ "$cur" != -* ]]; then
      COMPREPLY=($(compgen -W "$(sed -n '/^Subcommands:/,$ s/^  \([a-z][a-z-]*\) .*/\1/p' <<<"$help")" -- "$cur"))
      return
    fi
  else
    help="$("$gpuha" "$sub" --help 2>/dev/null)"
  fi
  COMPREPLY=($(compgen -W "$(grep -o -- '--[a-z][a-z0-9-]*' <<<"$help" | sort -u)" -- "$cur"))
}
complete -F _gpuha gpuha
