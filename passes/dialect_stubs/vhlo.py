"""No Python op classes for the `vhlo` dialect: ops stay generic OpViews (see __init__)."""
