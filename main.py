"""Entry point: `python main.py {fit,validate,test,predict} --config configs/<name>.yaml`."""

from leanagent.entry import run

if __name__ == "__main__":
    run()
