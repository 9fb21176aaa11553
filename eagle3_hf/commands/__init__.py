"""One module per `eagle3-hf` subcommand, each exposing `make_parser()` and `main(argv)`."""
