#!/usr/bin/env python3
"""Write a slice of a data.list: evenly spaced utterances, for a smoke run."""

import argparse

from kws.datalist import evenly_spaced, read_data_list, write_data_list
from kws.errors import cli


@cli
def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-list", required=True)
    parser.add_argument("--utterances", type=int, required=True, help="how many to keep")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    items = evenly_spaced(read_data_list(args.data_list), args.utterances)
    write_data_list(args.out, items)
    print(f"{args.out}: {len(items)} utterances")


if __name__ == "__main__":
    main()
