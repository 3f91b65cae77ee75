"""Entry point: `python main.py {fit,validate,test,predict} --config configs/<name>.yaml`."""

from leanagent.cli import main

if __name__ == "__main__":
    main()
