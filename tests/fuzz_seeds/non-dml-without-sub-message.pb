&" 

 ─Бо╙JshopRordersX0"*
(
 ─Бо╙JshopRordersX(z
kv$"

 ─Бо╙JshopRordersX."(
&
 ─Бо╙JshopRordersX)z
kv&" 

 ─Бо╙JshopRordersX 0"*
(
 ─Бо╙JshopRordersX*z
kv&" 

 ─Бо╙JshopRordersX!0"*
(
 ─Бо╙JshopRordersX+z
kv&" 

 ─Бо╙JshopRordersX"0"*
(
 ─Бо╙JshopRordersX,z
kv&" 

 ─Бо╙JshopRordersX#0"*
(
 ─Бо╙JshopRordersX-z
kv0"*
(
 ─Бо╙JshopRordersX2"
shop