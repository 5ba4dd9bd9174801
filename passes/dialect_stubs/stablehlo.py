"""No Python op classes for the `stablehlo` dialect: ops stay generic OpViews (see __init__)."""
