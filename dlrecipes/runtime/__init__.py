"""The machinery of the process a run lives in, beside :mod:`dlrecipes.core` at the bottom of the layers.

- :mod:`.hangup`: whether SIGHUP stops a run (not under ``nohup``), and leaving a closed terminal;
- :mod:`.process_state`: what a training call changes in its process (signal handlers, torch's flags, threads,
  logging handlers), put back when it returns; the cycle collector around the imports and at the exit;
- :mod:`.fork_server`: ``python -m dlrecipes`` forked from a server that imported torch and Composer once (a
  sweep's trainings on a CPU, and the tests' processes);
- :mod:`.composer_env`: what Composer's Trainer asks of the host at each start and checkpoint, answered once;
- :mod:`.hub`: whether the Hugging Face hub answers, asked once per process.

Besides :mod:`dlrecipes.errors` these modules import nothing of dlrecipes (the fork server's preload is named, not
imported: it is imported only in the server's own process).
"""
