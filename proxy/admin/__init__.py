"""The admin API (popmq.admin.v1.AdminService) served by every proxy."""
