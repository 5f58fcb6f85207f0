import sys

try:
    from moeopt.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line imports: its answer, not a traceback
    print("interrupted", file=sys.stderr, flush=True)
    raise SystemExit(130) from None

raise SystemExit(main())
