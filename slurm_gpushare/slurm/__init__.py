"""The one door to Slurm: everything the product reads from or writes to Slurm goes through here.

- :mod:`~slurm_gpushare.slurm.gres`: the GRES/TRES grammar (``name[:type][:count][(IDX:..)]``, with the
  ``gres:`` prefix of Slurm 22.05 and ``gres/`` of later releases), parsed and rendered in one place;
- :mod:`~slurm_gpushare.slurm.hostlist`: host lists and id ranges (``node[01-04]``, ``0-3,5``);
- :mod:`~slurm_gpushare.slurm.conf`: reading gres.conf and the GRES side of slurm.conf;
- :mod:`~slurm_gpushare.slurm.nodegres`: the GRES a node offers, derived from its machine description;
- :mod:`~slurm_gpushare.slurm.job`: job records as slurmctld reports them;
- :mod:`~slurm_gpushare.slurm.admincomment`: the tagged segments the product keeps in AdminComment;
- :mod:`~slurm_gpushare.slurm.commands`: the Slurm commands (``sinfo``, ``squeue``, ``scontrol``).
- :mod:`~slurm_gpushare.slurm.slurmd`: what ``slurmd -G`` prints (the GRES slurmd detected).

Importing this package does nothing.
"""
